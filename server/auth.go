package server

import (
	"context"
	"crypto/subtle"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// readOnlyMethods never need the token: reads, health, reflection.
// Fleet.GetFleet is a read that needs it all the same (fleet.proto): it
// lists the fleet's daemons and prefill instances.
var readOnlyMethods = map[string]bool{
	"/decodeplane.v1.Admin/GetStatus":         true,
	"/decodeplane.v1.Bootstrap/LookupDPRanks": true,
	"/decodeplane.v1.Rooms/GetRoom":           true,
	"/decodeplane.v1.Rooms/ListRooms":         true,
	"/decodeplane.v1.Rooms/WatchRoom":         true,
	"/decodeplane.v1.Staging/WatchWatermark":  true,
	"/decodeplane.v1.Staging/SetupStaging":    true, // the plan only: nothing is allocated
}

// needsToken reports whether a method mutates decodeplane's state: every
// method of decodeplane's own services except the reads above.
func needsToken(fullMethod string) bool {
	return strings.HasPrefix(fullMethod, "/decodeplane.v1.") && !readOnlyMethods[fullMethod]
}

// checkToken implements SGLang's bootstrap auth semantics (PUT /route): when a
// token is configured a mutating call needs "authorization: Bearer <token>"
// (scheme case-insensitive, constant-time compare); otherwise Unauthenticated
// and nothing is stored (the handler never runs).
func (s *Server) checkToken(ctx context.Context, fullMethod string) error {
	if s.cfg.AuthToken == "" || !needsToken(fullMethod) {
		return nil
	}
	md, _ := metadata.FromIncomingContext(ctx)
	if validBearer(md.Get("authorization"), s.cfg.AuthToken) {
		return nil
	}
	return status.Error(codes.Unauthenticated, "Unauthorized: this call needs \"authorization: Bearer <token>\" with the daemon's bootstrap token (SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN)")
}

func (s *Server) authUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if err := s.checkToken(ctx, info.FullMethod); err != nil {
		return nil, err
	}
	return h(ctx, req)
}

func (s *Server) authStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	if err := s.checkToken(ss.Context(), info.FullMethod); err != nil {
		return err
	}
	return h(srv, ss)
}

// validBearer reports whether one of the authorization values is "Bearer
// <token>" (scheme case-insensitive, constant-time compare); gRPC metadata
// and the HTTP routes' Authorization header share it.
func validBearer(values []string, token string) bool {
	for _, v := range values {
		scheme, tok, ok := strings.Cut(strings.TrimSpace(v), " ")
		if ok && strings.EqualFold(scheme, "bearer") && subtle.ConstantTimeCompare([]byte(strings.TrimSpace(tok)), []byte(token)) == 1 {
			return true
		}
	}
	return false
}
