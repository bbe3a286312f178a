package bench

import (
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/decodeplane/decodeplane/internal/testing/e2e"
)

// TestMain fails the package's tests if a goroutine outlives them (the
// in-process daemons, the fleets and the watchdog must all end).
// The binaries the end-to-end tests build are removed after the run.
func TestMain(m *testing.M) {
	code := m.Run()
	e2e.Cleanup()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			os.Stderr.WriteString("goleak: " + err.Error() + "\n")
			code = 1
		}
	}
	os.Exit(code)
}
