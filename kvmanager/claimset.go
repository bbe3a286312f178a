package kvmanager

// claimSet is a room's claims by prefill rank. Most rooms have one required
// rank, so the first claim is kept inline and a map is made only for a
// second rank: a room's claim costs no map.
type claimSet struct {
	k1   rankKey
	c1   *Claim
	more map[rankKey]*Claim
}

// A nil set has no claims.

func (s *claimSet) get(k rankKey) *Claim {
	if s == nil {
		return nil
	}
	if s.c1 != nil && s.k1 == k {
		return s.c1
	}
	return s.more[k]
}

func (s *claimSet) set(k rankKey, c *Claim) {
	switch {
	case s.c1 != nil && s.k1 == k, s.c1 == nil && s.more[k] == nil:
		s.k1, s.c1 = k, c
	default:
		if s.more == nil {
			s.more = make(map[rankKey]*Claim)
		}
		s.more[k] = c
	}
}

func (s *claimSet) remove(k rankKey) {
	if s == nil {
		return
	}
	if s.c1 != nil && s.k1 == k {
		s.k1, s.c1 = rankKey{}, nil
		return
	}
	delete(s.more, k)
}

// removeIf removes (and returns, in no order) the claims drop selects.
func (s *claimSet) removeIf(drop func(*Claim) bool) []*Claim {
	if s == nil {
		return nil
	}
	var out []*Claim
	if s.c1 != nil && drop(s.c1) {
		out = append(out, s.c1)
		s.k1, s.c1 = rankKey{}, nil
	}
	for k, c := range s.more {
		if drop(c) {
			out = append(out, c)
			delete(s.more, k)
		}
	}
	return out
}

// each calls f for every claim.
func (s *claimSet) each(f func(*Claim)) {
	if s == nil {
		return
	}
	if s.c1 != nil {
		f(s.c1)
	}
	for _, c := range s.more {
		f(c)
	}
}

// finishAll ends every claim with ev and empties the set.
func (s *claimSet) finishAll(ev DestinationEvent) {
	if s == nil {
		return
	}
	if s.c1 != nil {
		s.c1.finish(ev)
	}
	for _, c := range s.more {
		c.finish(ev)
	}
	*s = claimSet{}
}
