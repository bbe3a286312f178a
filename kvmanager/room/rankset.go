package room

import "github.com/decodeplane/decodeplane/kvmanager/ranks"

// rankSet is a room's progress per required prefill rank on one attempt.
// The first rank to claim or send is kept inline (one allocation for the
// set and that rank: a room usually hears from one prefill rank per decode
// rank), the others in a map made when a second one appears. A new attempt
// gets a new set, so that a transfer of the previous attempt still running
// holds a progress that is no longer the room's.
type rankSet struct {
	k1   ranks.RankKey
	rp1  rankProgress
	has1 bool
	more map[ranks.RankKey]*rankProgress
}

// get is k's progress, nil if none yet.
func (s *rankSet) get(k ranks.RankKey) *rankProgress {
	if s == nil {
		return nil
	}
	if s.has1 && s.k1 == k {
		return &s.rp1
	}
	return s.more[k]
}

// add makes k's progress (k has none yet).
func (s *rankSet) add(k ranks.RankKey) *rankProgress {
	if !s.has1 {
		s.k1, s.rp1, s.has1 = k, rankProgress{chunks: map[int]*chunkState{}, last: -1}, true
		return &s.rp1
	}
	if s.more == nil {
		s.more = make(map[ranks.RankKey]*rankProgress, 1)
	}
	rp := &rankProgress{chunks: map[int]*chunkState{}, last: -1}
	s.more[k] = rp
	return rp
}

// each calls f for every rank's progress.
func (s *rankSet) each(f func(*rankProgress)) {
	if s == nil {
		return
	}
	if s.has1 {
		f(&s.rp1)
	}
	for _, rp := range s.more {
		f(rp)
	}
}

// len is how many ranks have progress.
func (s *rankSet) len() int {
	if s == nil {
		return 0
	}
	n := len(s.more)
	if s.has1 {
		n++
	}
	return n
}

// eachKey calls f for every rank's progress with its key.
func (s *rankSet) eachKey(f func(ranks.RankKey, *rankProgress)) {
	if s == nil {
		return
	}
	if s.has1 {
		f(s.k1, &s.rp1)
	}
	for k, rp := range s.more {
		f(k, rp)
	}
}
