package bridge

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if a goroutine outlives them: otter's clean-up
// goroutine of a MemoryStore that was not closed, a callback server left open.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
