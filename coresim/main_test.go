package coresim

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package when a test leaves a goroutine behind: a callback worker,
// a poll still waiting for core time, a server or a connection that was not stopped.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
