package fleet_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain: every goroutine of the daemons, their fleet registries, the
// etcd clients and the embedded etcd ends with its test.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
