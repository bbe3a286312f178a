package ops

import (
	"context"
	"crypto/subtle"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// Auth. Every op of decodeplane's own services needs the token when one is
// configured, but the reads, which each op declares (Table: read ops);
// health and reflection never need it. A session's ops are authorized by
// their stream's token.

// NeedsToken reports whether a method needs the token: every method of
// decodeplane's own services except the read ops.
func (t *Table) NeedsToken(fullMethod string) bool {
	return strings.HasPrefix(fullMethod, "/decodeplane.v1.") && !t.reads[fullMethod]
}

// Authorize implements SGLang's bootstrap auth semantics (PUT /route): when
// a token is configured a method that needs it needs "authorization:
// Bearer <token>" in the incoming metadata (scheme case-insensitive,
// constant-time compare); otherwise UNAUTHENTICATED, and the op never runs.
func (t *Table) Authorize(ctx context.Context, fullMethod string) error {
	if t.cfg.Token == "" || !t.NeedsToken(fullMethod) {
		return nil
	}
	md, _ := metadata.FromIncomingContext(ctx)
	if ValidBearer(md.Get("authorization"), t.cfg.Token) {
		return nil
	}
	return status.Error(codes.Unauthenticated, "Unauthorized: this call needs \"authorization: Bearer <token>\" with the daemon's bootstrap token (SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN)")
}

// ValidBearer reports whether one of the authorization values is "Bearer
// <token>" (scheme case-insensitive, constant-time compare); gRPC metadata
// and the HTTP routes' Authorization header share it.
func ValidBearer(values []string, token string) bool {
	for _, v := range values {
		scheme, tok, ok := strings.Cut(strings.TrimSpace(v), " ")
		if ok && strings.EqualFold(scheme, "bearer") && subtle.ConstantTimeCompare([]byte(strings.TrimSpace(tok)), []byte(token)) == 1 {
			return true
		}
	}
	return false
}
