package httpboot

// POST /register_dp_rank (a prefill binds a room to its DP rank) and POST
// /query_dp_ranks (the decode side looks rooms' DP ranks up).

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"sync"

	"github.com/decodeplane/decodeplane/kvmanager"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

func (h *Routes) registerDPRank(w http.ResponseWriter, r *http.Request) {
	if !h.authorized(r) {
		writeText(w, http.StatusUnauthorized, "Unauthorized")
		return
	}
	var body struct {
		Room *uint64 `json:"bootstrap_room"`
		DP   *int64  `json:"dp_rank"`
	}
	qb := getQueryBufs()
	defer putQueryBufs(qb)
	raw, err := readBody(r.Body, qb.b[:0])
	qb.b = raw
	if err != nil {
		writeText(w, http.StatusBadRequest, decodeJSON(io.MultiReader(bytes.NewReader(raw), errReader{err}), &body).Error())
		return
	}
	if v, seen, ok := scanUintObject(raw, [2]string{"bootstrap_room", "dp_rank"}); ok && v[1] <= math.MaxInt64 {
		if seen[0] {
			body.Room = &v[0]
		}
		if seen[1] {
			dp := int64(v[1])
			body.DP = &dp
		}
	} else if err := decodeJSON(bytes.NewReader(raw), &body); err != nil {
		writeText(w, http.StatusBadRequest, err.Error())
		return
	}
	var errs []error
	if body.Room == nil {
		errs = append(errs, errors.New("bootstrap_room: is required (an integer in [0, 2^63-1])"))
	}
	if body.DP == nil {
		errs = append(errs, errors.New("dp_rank: is required (the prefill DP rank that scheduled the room)"))
	} else if *body.DP < 0 || *body.DP > math.MaxUint32 {
		errs = append(errs, fmt.Errorf("dp_rank: %d is out of range (allowed 0..dp_size-1)", *body.DP))
	}
	if len(errs) > 0 {
		writeText(w, http.StatusBadRequest, badRequest(errors.Join(errs...)))
		return
	}
	req := &pb.BindRoomRequest{BootstrapAddr: instanceAddr(r), Room: *body.Room, DpRank: uint32(*body.DP)}
	if err := req.Validate(); err != nil {
		writeText(w, http.StatusBadRequest, badRequest(err))
		return
	}
	// Bootstrap.BindRoom, checked above (its Validate) as the table's op
	// would check it.
	if _, err := h.t.BindRoom.Call(r.Context(), req); err != nil {
		writeStatus(w, err)
		return
	}
	writeText(w, http.StatusOK, "OK")
}

func (h *Routes) queryDPRanks(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Rooms []uint64 `json:"bootstrap_rooms"`
	}
	qb := getQueryBufs()
	defer putQueryBufs(qb)
	raw, err := readBody(r.Body, qb.b[:0])
	qb.b = raw
	if err != nil {
		writeText(w, http.StatusBadRequest, decodeJSON(io.MultiReader(bytes.NewReader(raw), errReader{err}), &body).Error())
		return
	}
	rooms, ok := scanRoomListInto(raw, qb.rooms[:0])
	if ok {
		qb.rooms = rooms
	} else {
		if err := decodeJSON(bytes.NewReader(raw), &body); err != nil {
			writeText(w, http.StatusBadRequest, err.Error())
			return
		}
		rooms = body.Rooms
	}
	addr := instanceAddr(r)
	// The wire bounds of Bootstrap.LookupDPRanks, checked in their one place.
	if err := (&pb.LookupDPRanksRequest{BootstrapAddr: addr, Rooms: rooms}).Validate(); err != nil {
		writeText(w, http.StatusBadRequest, badRequest(err))
		return
	}
	// The domain call of Bootstrap.LookupDPRanks (no hints here), answered
	// without the proto round trip: this is the hot read.
	var o pyObject
	res, _, err := h.m.LookupDPRanks(addr, rooms, nil)
	if errors.Is(err, kvmanager.ErrPrefillNotFound) {
		writeJSON(w, o.close()) // SGLang: an empty table answers {}
		return
	}
	if err != nil {
		writeStatus(w, h.t.Status(r.Context(), err))
		return
	}
	// The answer is written into the request's buffer (the body is parsed
	// by now) and handed to w, which copies it before Write returns.
	// A local slice (no pyObject field writes in the loop) keeps the
	// per-room appends free of GC write barriers.
	out := append(qb.b[:0], '{')
	for i, x := range res {
		if i > 0 {
			out = append(out, ", "...)
		}
		out = append(out, '"')
		out = strconv.AppendUint(out, x.Room, 10)
		out = append(out, `": `...)
		out = strconv.AppendInt(out, int64(x.DP), 10)
	}
	out = append(out, '}')
	qb.b = out
	writeJSON(w, out)
}

// queryBufs are one /query_dp_ranks call's request/answer bytes and parsed
// rooms, reused through queryPool.
type queryBufs struct {
	b     []byte
	rooms []uint64
}

var queryPool = sync.Pool{New: func() any { return &queryBufs{b: make([]byte, 0, 2048), rooms: make([]uint64, 0, 64)} }}

func getQueryBufs() *queryBufs { return queryPool.Get().(*queryBufs) }

// putQueryBufs returns the buffers to the pool unless they grew past 64 KiB
// (a rare large call does not pin its memory).
func putQueryBufs(q *queryBufs) {
	if cap(q.b) <= 64<<10 && cap(q.rooms) <= 8<<10 {
		queryPool.Put(q)
	}
}

// readBody is io.ReadAll into b (reused from the pool).
func readBody(r io.Reader, b []byte) ([]byte, error) {
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err != nil {
			if err == io.EOF {
				err = nil
			}
			return b, err
		}
	}
}
