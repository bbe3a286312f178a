package kvmanager

import "testing"

// claimSet behaves as a map by rank whether a claim sits inline or in the
// overflow map.
func TestClaimSetIsAMapByRank(t *testing.T) {
	var s claimSet
	ks := []rankKey{{TP: 0}, {TP: 1}, {TP: 2}, {CP: 1}}
	cs := make([]*Claim, len(ks))
	for i, k := range ks {
		cs[i] = &Claim{rank: RankID{CP: k.CP, TP: k.TP}}
		s.set(k, cs[i])
	}
	for i, k := range ks {
		if got := s.get(k); got != cs[i] {
			t.Errorf("get(%v) = %p, want %p", k, got, cs[i])
		}
	}
	s.remove(ks[0]) // the inline one
	if s.get(ks[0]) != nil {
		t.Errorf("get(%v) after remove = non-nil", ks[0])
	}
	again := &Claim{}
	s.set(ks[1], again) // replaces the one in the overflow map
	if s.get(ks[1]) != again {
		t.Errorf("set did not replace the claim of %v", ks[1])
	}
	n := 0
	s.each(func(*Claim) { n++ })
	if n != 3 {
		t.Errorf("each visited %d claims, want 3", n)
	}
	dropped := s.removeIf(func(c *Claim) bool { return c.rank.CP == 1 })
	if len(dropped) != 1 || dropped[0] != cs[3] || s.get(ks[3]) != nil {
		t.Errorf("removeIf(cp 1) = %v; want only the claim of %v", dropped, ks[3])
	}
	n = 0
	s.each(func(*Claim) { n++ })
	if n != 2 {
		t.Errorf("each visited %d claims after removeIf, want 2", n)
	}
}
