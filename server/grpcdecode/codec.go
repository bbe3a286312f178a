// Package grpcdecode makes undecodable gRPC requests (invalid UTF-8 in a
// string field, truncated or malformed bytes) INVALID_ARGUMENT naming the
// field, instead of grpc-go's Internal: a server codec records the decode
// error and the first interceptor turns the record into the status, so no
// partially decoded message reaches a handler. Used by the daemon's server
// and the reference agent.
package grpcdecode

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"strings"
	"unicode/utf8"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	// Registers grpc-go's proto codec, which decodeCodec wraps.
	_ "google.golang.org/grpc/encoding/proto"
)

// Undecodable requests are InvalidArgument.
//
// grpc-go (v1.85.0, rpc_util.go recv) turns every error of the server codec's
// Unmarshal into codes.Internal ("grpc: failed to unmarshal the received
// message"), so invalid UTF-8 in a string field — a client's fault — would
// read as a server bug, and no codec error can carry another code. Instead,
// decodeCodec's Unmarshal, when the message does not decode, resets the
// message (nothing partially decoded survives), records what is wrong in the
// message's own unknown fields under a per-process random nonce, and returns
// nil; the outermost interceptor (unary, and RecvMsg of streams) finds the
// record and answers InvalidArgument naming the field, before any other
// interceptor or handler sees the message. The record lives in the message, so
// nothing leaks whatever grpc does next (a second message on a unary call, a
// reset stream), and a client cannot forge it without the nonce. Use
// DecodeOptions to install both halves together.

// decodeMarkerNumber is the field number of the record: the largest valid
// one, which no API message uses.
const decodeMarkerNumber = protowire.MaxValidNumber

var (
	decodeNonce  = newDecodeNonce()
	decodeMarker = protowire.AppendTag(nil, decodeMarkerNumber, protowire.BytesType)
)

func newDecodeNonce() []byte {
	b := make([]byte, 16)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return b
}

// decodeCodec is grpc-go's proto codec with the decode-error record.
type decodeCodec struct{ base encoding.CodecV2 }

// Name is the codec's content subtype, "proto".
func (c decodeCodec) Name() string { return c.base.Name() }

// Marshal is the proto codec's, in one allocation for a message below
// grpc-go's pooling threshold (1 KiB; larger ones go to the proto codec,
// which marshals them into pooled buffers) instead of three: the proto codec
// allocates the bytes, the interface value holding them (a mem.SliceBuffer)
// and the one-element BufferSlice; here one block with room for the next
// size up (128, 256, 512 or 1,024 bytes) holds the BufferSlice's array, the
// SliceBuffer the interface points to and the bytes.
func (c decodeCodec) Marshal(v any) (mem.BufferSlice, error) {
	m, ok := v.(proto.Message)
	if !ok {
		return c.base.Marshal(v)
	}
	switch size := proto.Size(m); {
	case size <= 128:
		b := &small128{}
		return marshalInto(b.slice[:], &b.data, b.bytes[:0], m)
	case size <= 256:
		b := &small256{}
		return marshalInto(b.slice[:], &b.data, b.bytes[:0], m)
	case size <= 512:
		b := &small512{}
		return marshalInto(b.slice[:], &b.data, b.bytes[:0], m)
	case size <= 1024 && mem.IsBelowBufferPoolingThreshold(size):
		b := &small1024{}
		return marshalInto(b.slice[:], &b.data, b.bytes[:0], m)
	}
	return c.base.Marshal(v)
}

// smallN is a marshalled message of at most N bytes: the BufferSlice's
// array, the buffer it holds and the bytes, in one allocation.
type (
	small128 struct {
		slice [1]mem.Buffer
		data  mem.SliceBuffer
		bytes [128]byte
	}
	small256 struct {
		slice [1]mem.Buffer
		data  mem.SliceBuffer
		bytes [256]byte
	}
	small512 struct {
		slice [1]mem.Buffer
		data  mem.SliceBuffer
		bytes [512]byte
	}
	small1024 struct {
		slice [1]mem.Buffer
		data  mem.SliceBuffer
		bytes [1024]byte
	}
)

// marshalInto marshals m into buf (its capacity is the message's size or
// more), keeps the bytes in *data and returns slice holding data.
func marshalInto(slice []mem.Buffer, data *mem.SliceBuffer, buf []byte, m proto.Message) (mem.BufferSlice, error) {
	out, err := proto.MarshalOptions{UseCachedSize: true}.MarshalAppend(buf, m)
	if err != nil {
		return nil, err
	}
	*data = out
	slice[0] = data
	return slice, nil
}

// Unmarshal decodes v; when the data does not decode into a proto message,
// v is reset and carries the record of why, and the error is nil.
func (c decodeCodec) Unmarshal(data mem.BufferSlice, v any) error {
	err := c.base.Unmarshal(data, v)
	if err == nil {
		return nil
	}
	m, ok := v.(proto.Message)
	if !ok {
		return err
	}
	why := describeDecodeError(data.Materialize(), m.ProtoReflect().Descriptor(), err)
	proto.Reset(m)
	rec := append(append([]byte{}, decodeNonce...), why...)
	m.ProtoReflect().SetUnknown(protowire.AppendBytes(append([]byte{}, decodeMarker...), rec))
	return nil
}

// decodeError returns the InvalidArgument status recorded in msg by
// decodeCodec, or nil.
func decodeError(msg any) error {
	m, ok := msg.(proto.Message)
	if !ok {
		return nil
	}
	u := m.ProtoReflect().GetUnknown()
	if !bytes.HasPrefix(u, decodeMarker) {
		return nil
	}
	rec, n := protowire.ConsumeBytes(u[len(decodeMarker):])
	if n < 0 || len(u) != len(decodeMarker)+n || !bytes.HasPrefix(rec, decodeNonce) {
		return nil // a client's own unknown field, not our record
	}
	return status.Error(codes.InvalidArgument, string(rec[len(decodeNonce):]))
}

// describeDecodeError names what does not decode: the path of the field
// whose bytes break (rank.bootstrap_addr, buffers[2].name) and why — invalid
// UTF-8 in a string, a value running past its message — else protobuf-go's
// error for the whole request.
func describeDecodeError(b []byte, md protoreflect.MessageDescriptor, err error) string {
	path, why := findDecodeProblem(b, md, "", 0)
	switch {
	case why == errInvalidUTF8:
		return path + ": contains invalid UTF-8 (string fields must be valid UTF-8)"
	case why != "":
		if path == "" {
			path = "request"
		}
		return fmt.Sprintf("%s: cannot be decoded: %s (%v)", path, why, err)
	}
	return fmt.Sprintf("request: cannot be decoded as %s: %v", md.FullName(), err)
}

const errInvalidUTF8 = "invalid UTF-8"

// findDecodeProblem walks the wire bytes of a message of type md and returns
// the field path of the first problem and what it is, or "", "".
func findDecodeProblem(b []byte, md protoreflect.MessageDescriptor, prefix string, depth int) (path, why string) {
	if depth > 64 {
		return "", ""
	}
	at := strings.TrimSuffix(prefix, ".")
	var index map[protowire.Number]int
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return at, "a field tag is not valid protobuf"
		}
		b = b[n:]
		fd := md.Fields().ByNumber(num)
		if fd == nil || typ != protowire.BytesType {
			if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
				if fd == nil {
					return at, fmt.Sprintf("unknown field %d is truncated or not valid protobuf", num)
				}
				return prefix + string(fd.Name()), "the value is truncated or not valid protobuf"
			}
			b = b[n:]
			continue
		}
		name := prefix + string(fd.Name())
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return name, "its length runs past the end of the message"
		}
		b = b[n:]
		if fd.IsList() && (fd.Kind() == protoreflect.StringKind || fd.Kind() == protoreflect.MessageKind) {
			if index == nil {
				index = map[protowire.Number]int{}
			}
			name = fmt.Sprintf("%s[%d]", name, index[num])
			index[num]++
		}
		switch fd.Kind() {
		case protoreflect.StringKind:
			if !utf8.Valid(v) {
				return name, errInvalidUTF8
			}
		case protoreflect.MessageKind, protoreflect.GroupKind:
			if p, w := findDecodeProblem(v, fd.Message(), name+".", depth+1); w != "" {
				return p, w
			}
		}
	}
	return "", ""
}

// Check returns the InvalidArgument status of a request decodeCodec could
// not decode (naming the field), nil for any other message: for a server
// whose own outermost interceptor makes the check (Codec, then Check on the
// request of a unary call and on each message a stream receives, before
// anything else sees it), instead of DecodeOptions' interceptors.
func Check(msg any) error { return decodeError(msg) }

// decodeUnary refuses a request decodeCodec could not decode.
func decodeUnary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if err := decodeError(req); err != nil {
		return nil, err
	}
	return h(ctx, req)
}

// decodeStream refuses, in RecvMsg, a message decodeCodec could not decode.
func decodeStream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	return h(srv, decodeCheckedStream{ss})
}

type decodeCheckedStream struct{ grpc.ServerStream }

func (s decodeCheckedStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	return decodeError(m)
}

// DecodeOptions are the server options that make undecodable requests
// InvalidArgument: the codec and its interceptors. Put them first in
// grpc.NewServer's options so that the interceptors run outermost.
func DecodeOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		Codec(),
		grpc.ChainUnaryInterceptor(decodeUnary),
		grpc.ChainStreamInterceptor(decodeStream),
	}
}

// Codec is the server option of the codec alone; the server must then call
// Check itself.
func Codec() grpc.ServerOption {
	return grpc.ForceServerCodecV2(decodeCodec{base: encoding.GetCodecV2("proto")})
}
