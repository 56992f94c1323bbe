package bench

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/mdproxy/mdproxy/internal/testkit/bintest"
)

// TestMain fails the package when a test leaves a goroutine behind, and removes the
// binary the tests built.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.Cleanup(func(int) { bintest.RemoveBuilt() }))
}
