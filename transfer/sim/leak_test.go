package sim_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if a goroutine outlives them (the
// engine's timers and health loop must end with their tests).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
