package transferv1

import (
	"errors"
	"fmt"
)

// Wire-shape checks of the TransferAgent service, enforced by the validator
// interceptor (InvalidArgument). Whether a copy fits its buffers is the
// agent's check.

// Limits that bound the work of one call.
const (
	// MaxBufferIO is the most bytes ReadBuffer and WriteBuffer move per call.
	MaxBufferIO = 2 << 20
	// MaxBatchCopies bounds the copies of one batch.
	MaxBatchCopies = 1 << 20
	// MaxBuffers bounds the buffers of one RegisterBuffers call.
	MaxBuffers = 4096
)

func fieldErr(field, format string, args ...any) error {
	return fmt.Errorf("%s: %s", field, fmt.Sprintf(format, args...))
}

// Validate implements the validator interceptor's contract.
func (x *RegisterBuffersRequest) Validate() error {
	if n := len(x.GetBuffers()); n == 0 || n > MaxBuffers {
		return fieldErr("buffers", "has %d entries (allowed 1..%d)", n, MaxBuffers)
	}
	var errs []error
	seen := map[string]bool{}
	for i, b := range x.GetBuffers() {
		f := fmt.Sprintf("buffers[%d]", i)
		switch {
		case b.GetName() == "":
			errs = append(errs, fieldErr(f+".name", "is required"))
		case seen[b.GetName()]:
			errs = append(errs, fieldErr(f+".name", "%q is listed twice", b.GetName()))
		}
		seen[b.GetName()] = true
		if b.GetLength() == 0 || b.GetLength() > 1<<62 {
			errs = append(errs, fieldErr(f+".length", "%d must be in 1..2^62", b.GetLength()))
		}
		if _, ok := BufferKind_name[int32(b.GetKind())]; !ok || b.GetKind() == BufferKind_BUFFER_KIND_UNSPECIFIED {
			errs = append(errs, fieldErr(f+".kind", "%d is not a buffer kind (KV_POOL, STAGING_RING, METADATA, PREFILL_KV)", int32(b.GetKind())))
		}
	}
	return errors.Join(errs...)
}

// Validate implements the validator interceptor's contract.
func (x *SubmitBatchRequest) Validate() error {
	var errs []error
	if x.GetBatchId() == "" {
		errs = append(errs, fieldErr("batch_id", "is required: the batch's idempotency key"))
	}
	if n := len(x.GetCopies()); n > MaxBatchCopies {
		errs = append(errs, fieldErr("copies", "has %d entries (at most %d)", n, MaxBatchCopies))
	}
	if len(x.GetCopies()) == 0 && len(x.GetWrites()) == 0 {
		errs = append(errs, fieldErr("copies", "the batch moves nothing (no copies, no writes)"))
	}
	for i, c := range x.GetCopies() {
		if c.GetLength() == 0 || c.GetSrcBuffer() == "" || c.GetDstBuffer() == "" || c.GetLength() > 1<<62 || c.GetSrcOffset() > 1<<62 ||
			c.GetDstOffset() > 1<<62 || c.GetSrcStride() > 1<<40 || c.GetDstStride() > 1<<40 {
			errs = append(errs, fieldErr(fmt.Sprintf("copies[%d]", i), "needs src_buffer, dst_buffer and length > 0, with offsets and strides in range"))
			break
		}
	}
	for i, w := range x.GetWrites() {
		if w.GetDstBuffer() == "" || len(w.GetData()) == 0 || w.GetDstOffset() > 1<<62 {
			errs = append(errs, fieldErr(fmt.Sprintf("writes[%d]", i), "needs dst_buffer and data"))
			break
		}
	}
	return errors.Join(errs...)
}

// Validate implements the validator interceptor's contract.
func (x *ReadBufferRequest) Validate() error {
	var errs []error
	if x.GetName() == "" {
		errs = append(errs, fieldErr("name", "is required"))
	}
	if x.GetLength() > MaxBufferIO {
		errs = append(errs, fieldErr("length", "%d is above %d bytes per call", x.GetLength(), MaxBufferIO))
	}
	if x.GetOffset() > 1<<62 {
		errs = append(errs, fieldErr("offset", "%d is out of range", x.GetOffset()))
	}
	return errors.Join(errs...)
}

// Validate implements the validator interceptor's contract.
func (x *WriteBufferRequest) Validate() error {
	var errs []error
	if x.GetName() == "" {
		errs = append(errs, fieldErr("name", "is required"))
	}
	if len(x.GetData()) > MaxBufferIO {
		errs = append(errs, fieldErr("data", "%d bytes is above %d per call", len(x.GetData()), MaxBufferIO))
	}
	if x.GetOffset() > 1<<62 {
		errs = append(errs, fieldErr("offset", "%d is out of range", x.GetOffset()))
	}
	return errors.Join(errs...)
}
