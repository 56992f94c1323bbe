package main

import (
	"os"
	"path/filepath"
	"testing"
)

// TestPagesUpToDate fails when a committed page differs from what docgen writes from
// the code: a default, a variable, a metric or a label changed without `go generate
// ./sidecar/`.
func TestPagesUpToDate(t *testing.T) {
	for path, render := range pages {
		want, err := render()
		if err != nil {
			t.Fatalf("rendering %s: %v", path, err)
		}
		got, err := os.ReadFile(filepath.Join("..", "..", path))
		if err != nil {
			t.Fatalf("%v (run go generate ./sidecar/)", err)
		}
		if string(got) != string(want) {
			t.Errorf("%s differs from what the code generates: run go generate ./sidecar/ and commit it", path)
		}
	}
}
