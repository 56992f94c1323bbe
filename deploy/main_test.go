package deploy

import (
	"os"
	"testing"

	"github.com/mdproxy/mdproxy/internal/testkit/bintest"
)

// TestMain removes the binaries the tests built once for the package (the Helm
// chart's renderer too).
func TestMain(m *testing.M) {
	code := m.Run()
	bintest.RemoveBuilt()
	removeHelmTool()
	os.Exit(code)
}
