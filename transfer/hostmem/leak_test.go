package hostmem

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if a goroutine outlives them (streams,
// loops and servers must all end with their tests).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
