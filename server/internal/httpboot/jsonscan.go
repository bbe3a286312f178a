package httpboot

// The request bodies: SGLang's JSON, read by hand-written scanners on the
// hot path and by encoding/json otherwise.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
)

// errReader returns err (a body read error, e.g. http.MaxBytesError, for
// decodeJSON to name).
type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

// scanUintObject is the fast path of /register_dp_rank: a flat JSON object
// whose keys are among names (each at most once) and whose values are
// decimal integers that fit in uint64; anything else reports !ok and
// encoding/json decides.
func scanUintObject(b []byte, names [2]string) (vals [2]uint64, seen [2]bool, ok bool) {
	i := 0
	ws := func() {
		for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
			i++
		}
	}
	ws()
	if i >= len(b) || b[i] != '{' {
		return vals, seen, false
	}
	i++
	ws()
	if i < len(b) && b[i] == '}' {
		i++
		ws()
		return vals, seen, i == len(b)
	}
	for {
		ws()
		k := -1
		for j, n := range names {
			if len(b)-i >= len(n)+2 && b[i] == '"' && string(b[i+1:i+1+len(n)]) == n && b[i+1+len(n)] == '"' {
				k = j
				i += len(n) + 2
				break
			}
		}
		if k < 0 || seen[k] {
			return vals, seen, false
		}
		ws()
		if i >= len(b) || b[i] != ':' {
			return vals, seen, false
		}
		i++
		ws()
		start := i
		var v uint64
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			d := uint64(b[i] - '0')
			if v > (math.MaxUint64-d)/10 {
				return vals, seen, false
			}
			v = v*10 + d
			i++
		}
		if i == start || (b[start] == '0' && i-start > 1) {
			return vals, seen, false
		}
		vals[k], seen[k] = v, true
		ws()
		if i < len(b) && b[i] == ',' {
			i++
			continue
		}
		if i < len(b) && b[i] == '}' {
			i++
			ws()
			return vals, seen, i == len(b)
		}
		return vals, seen, false
	}
}

// scanRoomList is the fast path of /query_dp_ranks: it parses exactly
// {"bootstrap_rooms": [n, ...]} with decimal integers that fit in uint64 and
// optional whitespace; anything else (another key, a sign, a fraction, an
// overflow) reports !ok and encoding/json decides.
func scanRoomList(b []byte) ([]uint64, bool) { return scanRoomListInto(b, make([]uint64, 0, 64)) }

// scanRoomListInto is scanRoomList appending to rooms.
func scanRoomListInto(b []byte, rooms []uint64) ([]uint64, bool) {
	i := 0
	ws := func() {
		for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
			i++
		}
	}
	lit := func(s string) bool {
		ws()
		if !bytes.HasPrefix(b[i:], []byte(s)) {
			return false
		}
		i += len(s)
		return true
	}
	if !lit("{") || !lit(`"bootstrap_rooms"`) || !lit(":") || !lit("[") {
		return nil, false
	}
	ws()
	if i < len(b) && b[i] == ']' {
		i++
	} else {
		for {
			ws()
			start := i
			var v uint64
			for i < len(b) && b[i] >= '0' && b[i] <= '9' {
				d := uint64(b[i] - '0')
				if v > (math.MaxUint64-d)/10 {
					return nil, false
				}
				v = v*10 + d
				i++
			}
			if i == start || (b[start] == '0' && i-start > 1) {
				return nil, false
			}
			rooms = append(rooms, v)
			ws()
			if i < len(b) && b[i] == ',' {
				i++
				continue
			}
			if i < len(b) && b[i] == ']' {
				i++
				break
			}
			return nil, false
		}
	}
	if !lit("}") {
		return nil, false
	}
	ws()
	return rooms, i == len(b)
}

// decodeJSON decodes one JSON value; errors name the field and the type.
func decodeJSON(r io.Reader, v any) error {
	dec := json.NewDecoder(r)
	if err := dec.Decode(v); err != nil {
		var te *json.UnmarshalTypeError
		var mb *http.MaxBytesError
		switch {
		case errors.As(err, &mb):
			return fmt.Errorf("Bad request: the body is larger than %d bytes", mb.Limit)
		case errors.As(err, &te):
			return fmt.Errorf("Bad request: %s: a JSON %s is not allowed (want %s)", te.Field, te.Value, jsonKind(te.Type.Kind().String()))
		case errors.Is(err, io.EOF):
			return errors.New("Bad request: the body is empty (want a JSON object)")
		}
		return fmt.Errorf("Bad request: the body is not JSON: %v", err)
	}
	return nil
}

func jsonKind(k string) string {
	switch {
	case strings.HasPrefix(k, "int"), strings.HasPrefix(k, "uint"):
		return "an integer in range (non-negative where unsigned)"
	case k == "slice":
		return "a list"
	}
	return "a " + k
}

func badRequest(err error) string {
	return "Bad request: " + strings.ReplaceAll(strings.ReplaceAll(err.Error(), "\n", "; "), "parallel.", "")
}
