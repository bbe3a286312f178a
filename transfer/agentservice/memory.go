package agentservice

import (
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	transferv1 "github.com/decodeplane/decodeplane/proto/decodeplane/transfer/v1"
	"github.com/decodeplane/decodeplane/transfer/agentwire"
	"github.com/decodeplane/decodeplane/transfer/hostmem"
)

// registrations converts registered buffers and their memory from the
// wire. A memory without a kind is refused here too (the validator refuses
// it first where it runs): taking it for agent memory would leave an
// engine that meant its own memory reading bytes the agent never wrote.
func registrations(in []*transferv1.Buffer) ([]hostmem.Registration, error) {
	specs := agentwire.BuffersFromProto(in)
	out := make([]hostmem.Registration, len(in))
	for i, b := range in {
		mem, err := memoryFromProto(b.GetMemory())
		if err != nil {
			return nil, status.Error(codes.InvalidArgument, fmt.Sprintf("buffers[%d].memory: %v", i, err))
		}
		out[i] = hostmem.Registration{Spec: specs[i], Memory: mem}
	}
	return out, nil
}

// memoryFromProto: unset memory is agent memory.
func memoryFromProto(m *transferv1.BufferMemory) (hostmem.Memory, error) {
	if m == nil {
		return hostmem.Memory{}, nil
	}
	switch k := m.GetKind().(type) {
	case *transferv1.BufferMemory_Agent:
		return hostmem.Memory{Kind: hostmem.MemoryAgent}, nil
	case *transferv1.BufferMemory_Shared:
		// An offset past 2^62 (the validator's bound) stays out of range
		// for the store instead of wrapping to a negative int64.
		off := int64(min(k.Shared.GetOffset(), transferv1.MaxExtent+1))
		return hostmem.Memory{Kind: hostmem.MemoryShared, Path: k.Shared.GetPath(), Offset: off}, nil
	case *transferv1.BufferMemory_CudaIpc:
		return hostmem.Memory{Kind: hostmem.MemoryCudaIPC}, nil
	case *transferv1.BufferMemory_Nixl:
		return hostmem.Memory{Kind: hostmem.MemoryNixl}, nil
	}
	return hostmem.Memory{}, fmt.Errorf("has no kind (agent, shared, cuda_ipc or nixl; leave memory unset for agent memory)")
}
