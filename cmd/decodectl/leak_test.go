package main

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the tests if a goroutine outlives them (the in-process
// daemons, watch loops and connections must all end with their tests).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
