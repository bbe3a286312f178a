package kvmanager

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if any goroutine outlives them: the
// manager's timers, Run loop, transfers and claim/watch streams must all be
// gone once every test returned.
func TestMain(m *testing.M) {
	strictInvariants = true // a room and its ledger record out of step is a bug: fail loudly
	goleak.VerifyTestMain(m)
}
