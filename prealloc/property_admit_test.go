package prealloc

import (
	"slices"
	"sort"
)

// The property test's admission pass: a scan-based re-statement of
// SGLang's resume_retracted_reqs / pop_preallocated predicts every room
// admitted, resumed or left waiting (property_test.go).

// opAdmit predicts the pass with a scan of the shadow state, then compares.
func (s *sim) opAdmit() {
	st := s.l.Stats()
	freePages, freeSWA := int(st.Pages.Free), int(st.SWAPages.Free)
	freeReq, freeMeta, freeMamba := int(st.ReqSlots.Free), int(st.MetaSlots.Free), int(st.MambaSlots.Free)
	active := s.active()
	type exp struct {
		id      uint64
		resumed bool
	}
	var want []exp
	reason := BlockNone
	avail := func() int64 {
		a := int64(freePages) * s.page
		if s.swa == swaMirror {
			a = min(a, int64(freeSWA)*s.page)
		}
		return a
	}
	swaBudget := func(single int64) int64 {
		swaAvail := int64(freeSWA) * s.page
		used := int64(s.totalSWA)*s.page - swaAvail
		res := min(s.reserve*active, max(0, active*s.window-used))
		return swaAvail - max(res, single)
	}
	take := func(fill int64) (int, int) {
		p := s.pagesFor(fill)
		sw := 0
		if s.swa != swaNone {
			sw = p - s.firstSWAPage(fill)
		}
		return p, sw
	}
	remaining := slices.Clone(s.retracted)
	running := s.tally()[RoomRunning]
	if len(remaining) > 0 {
		budget := avail() - s.reserve*active
		var swaB int64
		if s.swa == swaTail {
			swaB = swaBudget(0)
		}
		for len(remaining) > 0 {
			r := s.rooms[remaining[0]]
			if r.retStep == s.steps && running > 0 {
				s.seen["resume: waits for a decode step"]++
				break
			}
			f := s.fill(Request{PromptLen: r.req.PromptLen, OutputLen: r.req.OutputLen})
			need := f + s.reserve
			p, sw := take(f)
			if freeReq <= 0 || need > budget || (s.swa == swaTail && s.tail(f) > swaB) ||
				freePages < p || freeSWA < sw || freeMamba < s.spr {
				break
			}
			freeReq--
			freePages -= p
			freeSWA -= sw
			freeMamba -= s.spr
			budget -= need
			swaB -= s.tail(f)
			active++
			want = append(want, exp{r.id, true})
			remaining = remaining[1:]
		}
	}
	switch {
	case len(remaining) > 0:
		reason = BlockRetracted
	case s.draining:
		reason = BlockDraining
	default:
		var ready []*shadowRoom
		var retractable, retractableSWA, maxKey, maxSWAKey int64
		for _, r := range s.rooms {
			switch r.state {
			case RoomReady:
				ready = append(ready, r)
			case RoomRunning:
				retractable += int64(r.req.PromptLen + r.req.OutputLen)
				retractableSWA += s.tail(int64(r.req.PromptLen)) + int64(r.req.OutputLen)
				maxKey = max(maxKey, min(int64(r.req.MaxNewTokens), s.clip)+int64(r.req.PromptLen))
				maxSWAKey = max(maxSWAKey, s.tail(int64(r.req.PromptLen))+min(int64(r.req.MaxNewTokens), s.clip))
			}
		}
		sort.Slice(ready, func(i, j int) bool {
			a, b := ready[i], ready[j]
			switch s.order {
			case orderLowFirst:
				if a.req.Priority != b.req.Priority {
					return a.req.Priority < b.req.Priority
				}
			case orderHighFirst:
				if a.req.Priority != b.req.Priority {
					return a.req.Priority > b.req.Priority
				}
			}
			return a.seq < b.seq
		})
		var single, singleSWA int64
		if running > 0 {
			single = maxKey - retractable
			singleSWA = maxSWAKey - retractableSWA
		}
		budget := avail() - max(s.reserve*active, single)
		var swaB int64
		if s.swa == swaTail {
			swaB = swaBudget(singleSWA)
		}
		// Head-of-line policy: a room that does not fit is set aside while it
		// has been bypassed fewer than max_bypass times (at most 8 per pass);
		// each admission behind it counts one bypass; a room bypassed
		// max_bypass times blocks strictly.
		var aside []*shadowRoom
		asideReason := BlockNone
		for _, r := range ready {
			if freeReq <= 0 {
				reason = BlockReqSlots
				break
			}
			if freeMeta <= 0 {
				reason = BlockMetadataSlots
				break
			}
			if s.spr > freeMamba {
				reason = BlockMamba
				break
			}
			f, o := s.fill(r.req), s.origin(r.req)
			mn := min(int64(r.req.MaxNewTokens), s.clip)
			p, sw := take(f)
			block := BlockNone
			switch {
			case max(int64(s.pagesFor(f))*s.page+s.reserve, o+mn-retractable) > budget:
				block = BlockTokens
			case s.swa == swaTail && max(s.tail(f), s.tail(f)+mn-retractableSWA) > swaB:
				block = BlockSWA
			case freePages < p:
				block = BlockTokens
			case freeSWA < sw && s.swa == swaTail:
				block = BlockSWA
			case freeSWA < sw:
				block = BlockTokens
			}
			if block != BlockNone {
				if r.bypassed < s.maxBypass && len(aside) < 8 {
					aside = append(aside, r)
					if asideReason == BlockNone {
						asideReason = block
					}
					continue
				}
				reason = block
				break
			}
			freeReq--
			freeMeta--
			freePages -= p
			freeSWA -= sw
			freeMamba -= s.spr
			active++
			budget = avail() - max(s.reserve*active, single)
			swaB -= s.tail(f)
			want = append(want, exp{r.id, false})
			exhausted := false
			for _, a := range aside {
				a.bypassed++
				exhausted = exhausted || a.bypassed >= s.maxBypass
			}
			if len(aside) > 0 {
				s.seen["admit: bypassed"]++
			}
			if exhausted {
				s.seen["block: bypass exhausted"]++
				reason = asideReason
				break
			}
		}
		if len(aside) > 0 && reason != BlockReqSlots && reason != BlockMetadataSlots && reason != BlockMamba {
			reason = asideReason // the head's reason
		}
	}

	adm, gotReason := s.l.Admit()
	var got []exp
	for _, a := range adm {
		got = append(got, exp{a.Room, a.Resumed})
	}
	if !slices.Equal(got, want) || gotReason != reason {
		s.fatalf("admit: got %v %s, want %v %s", got, gotReason, want, reason)
	}
	s.seen["block: "+reason.String()]++
	for _, a := range got {
		if a.resumed {
			s.seen["admit: resumed"]++
		} else {
			s.seen["admit: new"]++
		}
	}
	for _, a := range adm {
		r := s.rooms[a.Room]
		if a.Resumed {
			s.retracted = s.retracted[1:]
			r.state = RoomResumed
			r.req.Rebootstrap = false
			r.fill = s.fill(Request{PromptLen: r.req.PromptLen, OutputLen: r.req.OutputLen})
		} else {
			r.state = RoomAdmitted
			r.fill = s.fill(r.req)
			r.meta = true
		}
		r.pages = s.pagesFor(r.fill)
		r.swaFirst = s.firstSWAPage(r.fill)
		s.checkAllocation(r, a)
	}
}
