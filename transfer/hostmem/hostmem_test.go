package hostmem_test

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"github.com/decodeplane/decodeplane/transfer/hostmem"
	"github.com/decodeplane/decodeplane/transfer/kvcopy"
)

func TestStore(t *testing.T) {
	st := hostmem.New(1 << 10)
	specs := []kvcopy.BufferSpec{{Name: "a", Length: 64}, {Name: "b", Length: 64}}
	if _, err := st.Register(specs); err != nil {
		t.Fatal(err)
	}
	if err := st.Write("a", 0, []byte("0123456789abcdef")); err != nil {
		t.Fatal(err)
	}
	// Registering again with the same length keeps the bytes.
	if _, err := st.Register(specs[:1]); err != nil {
		t.Fatalf("Register again: %v", err)
	}
	if _, err := st.Register([]kvcopy.BufferSpec{{Name: "a", Length: 65}}); !errors.Is(err, hostmem.ErrLengthMismatch) {
		t.Errorf("Register with another length = %v, want ErrLengthMismatch", err)
	}
	if _, err := st.Register([]kvcopy.BufferSpec{{Name: "big", Length: 1 << 11}}); !errors.Is(err, hostmem.ErrTooLarge) {
		t.Errorf("Register past the limit = %v, want ErrTooLarge", err)
	}
	// Two rows of 4 bytes, strided 8 apart in the source and 4 in the
	// destination, plus an inline write after the copies.
	b := kvcopy.Batch{ID: "x", Copies: []kvcopy.Copy{{SrcBuffer: "a", SrcOffset: 2, DstBuffer: "b", DstOffset: 10, Length: 4, Count: 2, SrcStride: 8, DstStride: 4}},
		Writes: []kvcopy.InlineWrite{{DstBuffer: "b", DstOffset: 11, Data: []byte("Z")}}}
	n, err := st.Execute(context.Background(), b)
	if err != nil || n != 9 {
		t.Fatalf("Execute = %d, %v; want 9 bytes", n, err)
	}
	got, _ := st.Read("b", 10, 8)
	if want := []byte("2Z45abcd"); !bytes.Equal(got, want) {
		t.Errorf("b[10:18] = %q, want %q", got, want)
	}
	bad := []struct {
		name string
		c    kvcopy.Copy
		want error
	}{
		{"source past the end", kvcopy.Copy{SrcBuffer: "a", SrcOffset: 60, DstBuffer: "b", Length: 8}, hostmem.ErrOutOfRange},
		{"strided destination past the end", kvcopy.Copy{SrcBuffer: "a", DstBuffer: "b", DstOffset: 56, Length: 4, Count: 3, DstStride: 4}, hostmem.ErrOutOfRange},
		{"unknown buffer", kvcopy.Copy{SrcBuffer: "nope", DstBuffer: "b", Length: 1}, hostmem.ErrUnknownBuffer},
		{"zero length", kvcopy.Copy{SrcBuffer: "a", DstBuffer: "b"}, hostmem.ErrInvalid},
		{"2^32-1 rows over the same bytes (stride 0)", kvcopy.Copy{SrcBuffer: "a", DstBuffer: "b", Length: 8, Count: 1<<32 - 1}, hostmem.ErrInvalid},
	}
	for _, tc := range bad {
		before, _ := st.Read("b", 0, 64)
		if _, err := st.Execute(context.Background(), kvcopy.Batch{ID: tc.name, Copies: []kvcopy.Copy{b.Copies[0], tc.c}}); !errors.Is(err, tc.want) {
			t.Errorf("%s: Execute = %v, want %v", tc.name, err, tc.want)
		}
		if after, _ := st.Read("b", 0, 64); !bytes.Equal(before, after) {
			t.Errorf("%s: a refused batch wrote bytes", tc.name)
		}
	}
	if err := st.Deregister([]string{"a", "unknown"}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Read("a", 0, 1); !errors.Is(err, hostmem.ErrUnknownBuffer) {
		t.Errorf("Read after Deregister = %v, want ErrUnknownBuffer", err)
	}
}

func TestAgentCancelRoom(t *testing.T) {
	st := hostmem.New(0)
	if _, err := st.Register([]kvcopy.BufferSpec{{Name: "a", Length: 8}}); err != nil {
		t.Fatal(err)
	}
	agent := hostmem.NewAgent(st)
	entered := make(chan struct{})
	agent.SetHold(func(b kvcopy.Batch) bool { close(entered); return true })
	errc := make(chan error, 1)
	go func() {
		errc <- agent.Execute(context.Background(), kvcopy.Batch{ID: "held", Room: 4, Copies: []kvcopy.Copy{{SrcBuffer: "a", DstBuffer: "a", Length: 1}}})
	}()
	<-entered
	n, err := agent.CancelBatches(context.Background(), 4)
	if err != nil || n != 1 {
		t.Fatalf("CancelBatches = %d, %v; want 1", n, err)
	}
	if err := <-errc; !errors.Is(err, hostmem.ErrCancelled) {
		t.Errorf("Execute of a cancelled batch = %v, want ErrCancelled", err)
	}
	if agent.InFlight() != 0 {
		t.Errorf("InFlight = %d after the cancel, want 0", agent.InFlight())
	}
}
