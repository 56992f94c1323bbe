package deploy

import (
	"os"
	"testing"

	"github.com/mdproxy/mdproxy/internal/testkit/bintest"
)

// TestMain removes the binaries the tests built once for the package.
func TestMain(m *testing.M) {
	code := m.Run()
	bintest.RemoveBuilt()
	os.Exit(code)
}
