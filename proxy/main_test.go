package proxy

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if a goroutine outlives them: a server, a
// transport connection or a limiter wait left behind.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
