package bench

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if a goroutine outlives them (the
// in-process daemons, the fleets and the watchdog must all end).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
