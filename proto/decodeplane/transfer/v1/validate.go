package transferv1

import (
	"errors"
	"fmt"
	"math/bits"
	"strings"

	"github.com/decodeplane/decodeplane/proto/decodeplane/internal/fieldcheck"
)

// Wire-shape checks of the TransferAgent service, enforced by the validator
// interceptor (InvalidArgument) before any handler runs; the bounds are the
// ones the .proto comments state. Each error names the field path
// (copies[3].length) and what is allowed; every problem is reported at once.
// Whether a copy fits its buffers is the agent's check.

// Bounds of the decodeplane.transfer.v1 request fields.
const (
	// MaxBufferIO is the most bytes ReadBuffer and WriteBuffer move per call.
	MaxBufferIO = 2 << 20
	// MaxBatchCopies bounds the copies of one batch.
	MaxBatchCopies = 1 << 20
	// MaxBatchWrites bounds the inline writes of one batch.
	MaxBatchWrites = 1 << 16
	// MaxInlineWrite bounds the data of one inline write.
	MaxInlineWrite = 1 << 16
	// MaxBuffers bounds the buffers of one RegisterBuffers call (and the names
	// of one DeregisterBuffers call).
	MaxBuffers = 4096
	// MaxNameLen bounds buffer names and batch ids, in bytes.
	MaxNameLen = 256
	// MaxBatchIDs bounds replay_batch_ids and CancelRoom's batch_ids.
	MaxBatchIDs = 1 << 20
	// MaxExtent bounds buffer lengths, offsets and the end of every copy row
	// and write (2^62 bytes).
	MaxExtent = 1 << 62
	// MaxStride bounds src_stride and dst_stride.
	MaxStride = 1 << 40
	// MaxCopyRows bounds a copy's count.
	MaxCopyRows = 1 << 24
	// MaxSharedPath bounds a shared-memory file's path, in bytes.
	MaxSharedPath = 4096
	// SharedOffsetAlign: a shared-memory region's offset is a multiple of it.
	SharedOffsetAlign = 4096
	// CudaIpcHandleLen is the size of a cudaIpcMemHandle_t.
	CudaIpcHandleLen = 64
	// MaxCudaDevice bounds a CUDA IPC handle's device ordinal.
	MaxCudaDevice = 1023
	// MaxNixlDescriptor bounds a NIXL descriptor, in bytes.
	MaxNixlDescriptor = 1 << 16
)

func fieldErr(field, format string, args ...any) error {
	return fieldcheck.Err(field, format, args...)
}

func checkName(field, name, what string) error {
	switch {
	case name == "":
		return fieldErr(field, "is required (%s, at most %d bytes)", what, MaxNameLen)
	case len(name) > MaxNameLen:
		return fieldErr(field, "is %d bytes long (at most %d)", len(name), MaxNameLen)
	}
	return nil
}

// repeated reports a repeated field's bad entries (fieldcheck.Repeated).
type repeated = fieldcheck.Repeated

// CopyEnd returns the end of a copy's rows on one side, offset +
// (rows−1)·stride + length, and false when it overflows 64 bits.
func CopyEnd(offset, stride, length uint64, count uint32) (uint64, bool) {
	rows := uint64(max(count, 1))
	hi, span := bits.Mul64(rows-1, stride)
	if hi != 0 {
		return 0, false
	}
	end, c1 := bits.Add64(offset, span, 0)
	end, c2 := bits.Add64(end, length, 0)
	return end, c1 == 0 && c2 == 0
}

// Validate implements the validator interceptor's contract.
func (x *RegisterBuffersRequest) Validate() error {
	if n := len(x.GetBuffers()); n == 0 || n > MaxBuffers {
		return fieldErr("buffers", "has %d entries (allowed 1..%d)", n, MaxBuffers)
	}
	var rep repeated
	seen := make(map[string]bool, len(x.GetBuffers()))
	for i, b := range x.GetBuffers() {
		f := fmt.Sprintf("buffers[%d]", i)
		if err := checkName(f+".name", b.GetName(), "the buffer's name"); err != nil {
			rep.Add(err)
		} else if seen[b.GetName()] {
			rep.Add(fieldErr(f+".name", "%q is listed twice", b.GetName()))
		}
		seen[b.GetName()] = true
		if b.GetLength() == 0 || b.GetLength() > MaxExtent {
			rep.Add(fieldErr(f+".length", "%d must be in 1..2^62", b.GetLength()))
		}
		if b.GetItemSize() > MaxExtent {
			rep.Add(fieldErr(f+".item_size", "%d must be in 0..2^62", b.GetItemSize()))
		}
		if _, ok := BufferKind_name[int32(b.GetKind())]; !ok || b.GetKind() == BufferKind_BUFFER_KIND_UNSPECIFIED {
			rep.Add(fieldErr(f+".kind", "%d is not a buffer kind (KV_POOL, STAGING_RING, METADATA, PREFILL_KV)", int32(b.GetKind())))
		}
		if m := b.GetMemory(); m != nil {
			for _, err := range m.validate(f+".memory", b.GetLength()) {
				rep.Add(err)
			}
		}
	}
	return rep.Err("buffers")
}

// validate checks a buffer's memory; length is the buffer's.
func (m *BufferMemory) validate(f string, length uint64) []error {
	switch k := m.GetKind().(type) {
	case nil:
		return []error{fieldErr(f, "has no kind (agent, shared, cuda_ipc or nixl; leave memory unset for agent memory)")}
	case *BufferMemory_Agent:
		return nil
	case *BufferMemory_Shared:
		return k.Shared.validate(f+".shared", length)
	case *BufferMemory_CudaIpc:
		var errs []error
		if n := len(k.CudaIpc.GetHandle()); n != CudaIpcHandleLen {
			errs = append(errs, fieldErr(f+".cuda_ipc.handle", "has %d bytes (a cudaIpcMemHandle_t: exactly %d)", n, CudaIpcHandleLen))
		}
		if d := k.CudaIpc.GetDevice(); d < 0 || d > MaxCudaDevice {
			errs = append(errs, fieldErr(f+".cuda_ipc.device", "%d is out of range (allowed 0..%d)", d, MaxCudaDevice))
		}
		return errs
	case *BufferMemory_Nixl:
		if n := len(k.Nixl.GetSerialized()); n == 0 || n > MaxNixlDescriptor {
			return []error{fieldErr(f+".nixl.serialized", "has %d bytes (allowed 1..%d)", n, MaxNixlDescriptor)}
		}
		return nil
	}
	return []error{fieldErr(f, "has an unknown kind %T", m.GetKind())}
}

// validate checks a shared-memory region; length is the buffer's.
func (s *SharedMemory) validate(f string, length uint64) []error {
	var errs []error
	switch p := s.GetPath(); {
	case p == "":
		errs = append(errs, fieldErr(f+".path", "is required (the file's absolute path, 1..%d bytes)", MaxSharedPath))
	case len(p) > MaxSharedPath:
		errs = append(errs, fieldErr(f+".path", "is %d bytes long (at most %d)", len(p), MaxSharedPath))
	case p[0] != '/':
		errs = append(errs, fieldErr(f+".path", "%q is not absolute (it must start with /)", p))
	case strings.IndexByte(p, 0) >= 0:
		errs = append(errs, fieldErr(f+".path", "contains a NUL byte (at %d)", strings.IndexByte(p, 0)))
	}
	switch off := s.GetOffset(); {
	case off > MaxExtent:
		errs = append(errs, fieldErr(f+".offset", "%d is out of range (allowed 0..2^62, a multiple of %d)", off, SharedOffsetAlign))
	case off%SharedOffsetAlign != 0:
		errs = append(errs, fieldErr(f+".offset", "%d is not a multiple of %d", off, SharedOffsetAlign))
	case length <= MaxExtent && off+length > MaxExtent:
		errs = append(errs, fieldErr(f+".offset", "%d + length %d ends beyond 2^62 bytes", off, length))
	}
	return errs
}

// Validate implements the validator interceptor's contract.
func (x *DeregisterBuffersRequest) Validate() error {
	if n := len(x.GetNames()); n > MaxBuffers {
		return fieldErr("names", "has %d entries (at most %d)", n, MaxBuffers)
	}
	var rep repeated
	for i, n := range x.GetNames() {
		rep.Add(checkName(fmt.Sprintf("names[%d]", i), n, "a buffer name"))
	}
	return rep.Err("names")
}

func (c *Copy) validate(f string) []error {
	var errs []error
	if err := checkName(f+".src_buffer", c.GetSrcBuffer(), "the source buffer"); err != nil {
		errs = append(errs, err)
	}
	if err := checkName(f+".dst_buffer", c.GetDstBuffer(), "the destination buffer"); err != nil {
		errs = append(errs, err)
	}
	if c.GetLength() == 0 || c.GetLength() > MaxExtent {
		errs = append(errs, fieldErr(f+".length", "%d must be in 1..2^62", c.GetLength()))
	}
	if c.GetCount() > MaxCopyRows {
		errs = append(errs, fieldErr(f+".count", "%d is out of range (allowed 0..%d; 0 means 1)", c.GetCount(), MaxCopyRows))
	}
	for _, side := range []struct {
		name           string
		offset, stride uint64
	}{{"src", c.GetSrcOffset(), c.GetSrcStride()}, {"dst", c.GetDstOffset(), c.GetDstStride()}} {
		if side.stride > MaxStride {
			errs = append(errs, fieldErr(f+"."+side.name+"_stride", "%d is out of range (allowed 0..2^40)", side.stride))
			continue
		}
		if side.offset > MaxExtent {
			errs = append(errs, fieldErr(f+"."+side.name+"_offset", "%d is out of range (allowed 0..2^62)", side.offset))
			continue
		}
		if end, ok := CopyEnd(side.offset, side.stride, c.GetLength(), c.GetCount()); !ok || end > MaxExtent {
			errs = append(errs, fieldErr(f+"."+side.name+"_offset", "the copy's last row ends beyond 2^62 bytes (%s_offset + (count-1)·%s_stride + length)", side.name, side.name))
		}
	}
	return errs
}

// Validate implements the validator interceptor's contract.
func (x *SubmitBatchRequest) Validate() error {
	errs := []error{checkName("batch_id", x.GetBatchId(), "the batch's idempotency key")}
	if n := len(x.GetCopies()); n > MaxBatchCopies {
		errs = append(errs, fieldErr("copies", "has %d entries (at most %d)", n, MaxBatchCopies))
	} else {
		var rep repeated
		for i, c := range x.GetCopies() {
			for _, err := range c.validate(fmt.Sprintf("copies[%d]", i)) {
				rep.Add(err)
			}
		}
		errs = append(errs, rep.Err("copies"))
	}
	if n := len(x.GetWrites()); n > MaxBatchWrites {
		errs = append(errs, fieldErr("writes", "has %d entries (at most %d)", n, MaxBatchWrites))
	} else {
		var rep repeated
		for i, w := range x.GetWrites() {
			f := fmt.Sprintf("writes[%d]", i)
			rep.Add(checkName(f+".dst_buffer", w.GetDstBuffer(), "the destination buffer"))
			if n := len(w.GetData()); n == 0 || n > MaxInlineWrite {
				rep.Add(fieldErr(f+".data", "has %d bytes (allowed 1..%d)", n, MaxInlineWrite))
			}
			if w.GetDstOffset() > MaxExtent-MaxInlineWrite {
				rep.Add(fieldErr(f+".dst_offset", "%d is out of range (allowed 0..2^62-2^16)", w.GetDstOffset()))
			}
		}
		errs = append(errs, rep.Err("writes"))
	}
	if len(x.GetCopies()) == 0 && len(x.GetWrites()) == 0 {
		errs = append(errs, fieldErr("copies", "the batch moves nothing (no copies, no writes)"))
	}
	if d := x.GetDeadline(); d != nil {
		if err := d.CheckValid(); err != nil {
			errs = append(errs, fieldErr("deadline", "is not a valid timestamp: %v", err))
		}
	}
	return errors.Join(errs...)
}

func checkBatchIDs(field string, ids []string) error {
	if n := len(ids); n > MaxBatchIDs {
		return fieldErr(field, "has %d entries (at most %d)", n, MaxBatchIDs)
	}
	var rep repeated
	for i, id := range ids {
		rep.Add(checkName(fmt.Sprintf("%s[%d]", field, i), id, "a batch id"))
	}
	return rep.Err(field)
}

// Validate implements the validator interceptor's contract.
func (x *WatchCompletionsRequest) Validate() error {
	return checkBatchIDs("replay_batch_ids", x.GetReplayBatchIds())
}

// Validate implements the validator interceptor's contract.
func (x *CancelRoomRequest) Validate() error { return checkBatchIDs("batch_ids", x.GetBatchIds()) }

// Validate implements the validator interceptor's contract.
func (x *ReadBufferRequest) Validate() error {
	errs := []error{checkName("name", x.GetName(), "the buffer's name")}
	if x.GetLength() > MaxBufferIO {
		errs = append(errs, fieldErr("length", "%d is above %d bytes per call", x.GetLength(), MaxBufferIO))
	}
	if x.GetOffset() > MaxExtent {
		errs = append(errs, fieldErr("offset", "%d is out of range (allowed 0..2^62)", x.GetOffset()))
	}
	return errors.Join(errs...)
}

// Validate implements the validator interceptor's contract.
func (x *WriteBufferRequest) Validate() error {
	errs := []error{checkName("name", x.GetName(), "the buffer's name")}
	if len(x.GetData()) > MaxBufferIO {
		errs = append(errs, fieldErr("data", "%d bytes is above %d per call", len(x.GetData()), MaxBufferIO))
	}
	if x.GetOffset() > MaxExtent {
		errs = append(errs, fieldErr("offset", "%d is out of range (allowed 0..2^62)", x.GetOffset()))
	}
	return errors.Join(errs...)
}
