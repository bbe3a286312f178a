package decodeplanev1

import (
	"errors"
	"fmt"
	"strings"
)

// Bounds of Rooms.RegisterEngineLayout and of TransferSource's fields for
// the decode engine's layout (see their messages' comments). What depends
// on kv_pool (the layers, item lengths, sizes, state types of the pool's
// kind) is the daemon's to check.
const (
	MaxLayoutKV        = 4096
	MaxLayoutAux       = 64
	MaxLayoutState     = 16
	MaxLayoutLayer     = 4095
	MaxLayoutName      = 128
	MaxLayoutItem      = 1 << 40
	MaxLayoutRow       = 1 << 24
	MaxLayoutLength    = 1 << 62
	MaxSharedPathLen   = 4096
	SharedOffsetAlign  = 4096
	CudaIpcHandleLen   = 64
	MaxCudaDevice      = 1023
	MaxNixlDescriptor  = 1 << 16
	MaxSourceAuxRow    = 1<<24 - 1
	MaxSourceStates    = 4
	ReservedBufferPath = "decode/"
)

// Validate implements the validator interceptor's contract: every problem,
// each named by its path (layout.kv[3].item_len).
func (x *RegisterEngineLayoutRequest) Validate() error {
	errs := []error{checkMax("decode_dp_rank", uint64(x.GetDecodeDpRank()), MaxRank), checkMax("decode_tp_rank", uint64(x.GetDecodeTpRank()), MaxRank)}
	l := x.GetLayout()
	if l == nil {
		return errors.Join(append(errs, fieldErr("layout", "is required"))...)
	}
	return errors.Join(append(errs, l.validate("layout."))...)
}

// validate checks a layout's wire bounds, its fields named under at.
func (l *EngineLayout) validate(at string) error {
	var errs []error
	switch n := len(l.GetKv()); {
	case n == 0 || n > MaxLayoutKV:
		return fieldErr(at+"kv", "has %d buffers (allowed 1..%d)", n, MaxLayoutKV)
	}
	if n := len(l.GetAux()); n == 0 || n > MaxLayoutAux {
		return fieldErr(at+"aux", "has %d buffers (allowed 1..%d, the marker's among them)", n, MaxLayoutAux)
	}
	if n := len(l.GetState()); n > MaxLayoutState {
		return fieldErr(at+"state", "has %d buffers (at most %d)", n, MaxLayoutState)
	}
	names := map[string]string{}
	var rep repeated
	name := func(f, n string) {
		if p := checkBufferName(n); p != "" {
			rep.Add(fieldErr(f, "%s", p))
		} else if prev, dup := names[n]; dup {
			rep.Add(fieldErr(f, "%q is also %s: every buffer needs its own name", n, prev))
		} else {
			names[n] = f
		}
	}
	for i, b := range l.GetKv() {
		f := fmt.Sprintf("%skv[%d]", at, i)
		name(f+".name", b.GetName())
		rep.Add(checkMax(f+".layer", uint64(b.GetLayer()), MaxLayoutLayer))
		rep.Add(checkRange(f+".item_len", b.GetItemLen(), 1, MaxLayoutItem))
		rep.Add(checkRange(f+".length", b.GetLength(), 1, MaxLayoutLength))
		rep.Add(b.GetMemory().validate(f+".memory", b.GetLength()))
	}
	for i, b := range l.GetAux() {
		f := fmt.Sprintf("%saux[%d]", at, i)
		name(f+".name", b.GetName())
		rep.Add(checkRange(f+".row_len", b.GetRowLen(), 1, MaxLayoutRow))
		rep.Add(checkRange(f+".length", b.GetLength(), 1, MaxLayoutLength))
		rep.Add(b.GetMemory().validate(f+".memory", b.GetLength()))
	}
	for i, b := range l.GetState() {
		f := fmt.Sprintf("%sstate[%d]", at, i)
		name(f+".name", b.GetName())
		if t := b.GetType(); t != StateType_STATE_TYPE_MAMBA && t != StateType_STATE_TYPE_SWA {
			rep.Add(fieldErr(f+".type", "%s is not a state buffer's type (allowed STATE_TYPE_MAMBA, STATE_TYPE_SWA; hybrid-MLA's DSA indexer is inside its KV items)", t))
		}
		rep.Add(checkRange(f+".item_len", b.GetItemLen(), 1, MaxLayoutItem))
		rep.Add(checkRange(f+".length", b.GetLength(), 1, MaxLayoutLength))
		rep.Add(b.GetMemory().validate(f+".memory", b.GetLength()))
	}
	errs = append(errs, rep.Err(at+"buffers"))
	if m := l.GetMarker(); m == "" {
		errs = append(errs, fieldErr(at+"marker", "is required: the name of the aux buffer whose row begins with the room marker"))
	} else if f, ok := names[m]; !ok || !strings.HasPrefix(f, at+"aux[") {
		errs = append(errs, fieldErr(at+"marker", "%s is not one of the aux buffers' names", short(m)))
	}
	return errors.Join(errs...)
}

// checkBufferName is what is wrong with an engine buffer's name, or "".
func checkBufferName(n string) string {
	if len(n) == 0 || len(n) > MaxLayoutName {
		return fmt.Sprintf("is %d bytes (allowed 1..%d)", len(n), MaxLayoutName)
	}
	for i := range len(n) {
		c := n[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '/' || c == '-') {
			return fmt.Sprintf("has byte %#02x at %d (allowed A-Z a-z 0-9 . _ / -)", c, i)
		}
	}
	if strings.HasPrefix(n, ReservedBufferPath) {
		return fmt.Sprintf("%q begins with %q, which names decodeplane's own buffers", n, ReservedBufferPath)
	}
	return ""
}

// checkRange is lo <= v <= hi.
func checkRange(field string, v, lo, hi uint64) error {
	if v < lo || v > hi {
		return fieldErr(field, "%d is out of range (allowed %d..%d)", v, lo, hi)
	}
	return nil
}

// validate checks an engine buffer's memory (nil: agent memory).
func (m *EngineMemory) validate(field string, length uint64) error {
	if m == nil {
		return nil
	}
	switch k := m.GetKind().(type) {
	case *EngineMemory_Shared:
		p, off := k.Shared.GetPath(), k.Shared.GetOffset()
		switch {
		case len(p) == 0 || len(p) > MaxSharedPathLen || p[0] != '/' || strings.IndexByte(p, 0) >= 0:
			return fieldErr(field+".shared.path", "must be an absolute path of 1..%d bytes without a NUL byte", MaxSharedPathLen)
		case off%SharedOffsetAlign != 0 || off > MaxLayoutLength || length <= MaxLayoutLength && off+length > MaxLayoutLength:
			return fieldErr(field+".shared.offset", "%d must be a multiple of %d with offset + length <= 2^62", off, SharedOffsetAlign)
		}
	case *EngineMemory_CudaIpc:
		if n := len(k.CudaIpc.GetHandle()); n != CudaIpcHandleLen {
			return fieldErr(field+".cuda_ipc.handle", "has %d bytes (a cudaIpcMemHandle_t has exactly %d)", n, CudaIpcHandleLen)
		}
		if d := k.CudaIpc.GetDevice(); d < 0 || d > MaxCudaDevice {
			return fieldErr(field+".cuda_ipc.device", "%d is out of range (allowed 0..%d)", d, MaxCudaDevice)
		}
	case *EngineMemory_Nixl:
		if n := len(k.Nixl.GetSerialized()); n == 0 || n > MaxNixlDescriptor {
			return fieldErr(field+".nixl.serialized", "has %d bytes (allowed 1..%d)", n, MaxNixlDescriptor)
		}
	default:
		return fieldErr(field, "has no kind (shared, cuda_ipc or nixl; leave memory unset for agent memory)")
	}
	return nil
}

// checkSourceLast checks TransferSource's last-chunk fields: aux_row and
// state only on the last chunk, within their bounds.
func checkSourceLast(src *TransferSource, last bool) []error {
	var errs []error
	if src.AuxRow != nil {
		switch {
		case !last:
			errs = append(errs, fieldErr("source.aux_row", "is set on a chunk that is not the last: the aux rows travel with the last chunk"))
		case src.GetAuxRow() > MaxSourceAuxRow:
			errs = append(errs, fieldErr("source.aux_row", "%d is out of range (allowed 0..%d)", src.GetAuxRow(), MaxSourceAuxRow))
		}
	}
	st := src.GetState()
	if len(st) == 0 {
		return errs
	}
	if !last {
		return append(errs, fieldErr("source.state", "is set on a chunk that is not the last: the state travels with the last chunk"))
	}
	return append(errs, checkStates("source.state", st, MaxSourceStates)...)
}
