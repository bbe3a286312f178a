package ops

import (
	"fmt"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Daemon incarnations. internal/daemon draws a random non-zero incarnation
// at every start (Config.Incarnation); the table returns it in
// RegisterPrefillResponse, HeartbeatResponse, GetStatusResponse and every
// Destination, and refuses any request about a destination that names
// another one. The check is made in one place, each op's Check (op.go),
// after validation and before the domain call, whatever the transport, so
// a refused call reaches no domain code: every request message with an
// incarnation field (TransferRequest, ReportTransferRequest,
// AwaitDestinationRequest, AllocateStagingRequest, ChunkReadyRequest,
// AckRoomEndRequest, PrefillHello) is checked by its GetIncarnation method.

// ReasonStaleIncarnation is the ErrorInfo reason of a refused stale call.
const ReasonStaleIncarnation = "STALE_INCARNATION"

// ErrorDomain is the ErrorInfo domain of decodeplane's error details.
const ErrorDomain = "decodeplane.v1"

// StaleMetrics counts the calls refused for naming another incarnation
// (metrics.Metrics: decodeplane_stale_incarnation_total{method}).
type StaleMetrics interface {
	StaleIncarnation(fullMethod string)
}

// incarnated is a request that names the incarnation of its destination.
type incarnated interface{ GetIncarnation() uint64 }

// checkIncarnation refuses a request that names an incarnation other than
// the daemon's: 0 is not checked (clients older than incarnations), nor is
// anything on a table built without an incarnation (Config.Incarnation 0).
func (t *Table) checkIncarnation(fullMethod string, m any) error {
	own := t.cfg.Incarnation
	if own == 0 {
		return nil
	}
	v, ok := m.(incarnated)
	if !ok {
		return nil
	}
	got := v.GetIncarnation()
	if got == 0 || got == own {
		return nil
	}
	if t.cfg.Stale != nil {
		t.cfg.Stale.StaleIncarnation(fullMethod)
	}
	return staleIncarnationError(got, own)
}

// staleIncarnationError is FAILED_PRECONDITION with an ErrorInfo whose
// reason is STALE_INCARNATION and whose metadata give both values in hex.
func staleIncarnationError(got, own uint64) error {
	st := status.New(codes.FailedPrecondition, fmt.Sprintf(
		"destination of an earlier decodeplane incarnation %x (this daemon is %x): every destination it handed out is void; re-register and re-claim", got, own))
	if d, err := st.WithDetails(&errdetails.ErrorInfo{Reason: ReasonStaleIncarnation, Domain: ErrorDomain, Metadata: map[string]string{
		"incarnation":        fmt.Sprintf("%x", got),
		"daemon_incarnation": fmt.Sprintf("%x", own),
	}}); err == nil {
		st = d
	}
	return st.Err()
}

// Incarnation is the daemon's incarnation (Config.Incarnation).
func (t *Table) Incarnation() uint64 { return t.cfg.Incarnation }
