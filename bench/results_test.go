package bench

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// TestCommittedAdaptiveResults: the committed runs of issue 32 hold its acceptance — no
// fixed-rate case as good as Adaptive on both Core's duration and the last result, on
// each workload — and the bursty one shows the adaptive limit at work (its rate under its
// ceiling for a while), as bench/results/README.md says.
func TestCommittedAdaptiveResults(t *testing.T) {
	for _, name := range []string{"adaptive-steady.json", "adaptive-bursty.json"} {
		b, err := os.ReadFile(filepath.Join("results", name))
		if err != nil {
			t.Fatal(err)
		}
		var figs []Figures
		if err := json.Unmarshal(b, &figs); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if err := CheckAdaptive(figs); err != nil {
			t.Errorf("%s: %v", name, err)
		}
		if name != "adaptive-bursty.json" {
			continue
		}
		for _, f := range figs {
			if f.Case == "Adaptive" && (f.AdaptiveBelowCeilingMin == nil || *f.AdaptiveBelowCeilingMin <= 0) {
				t.Errorf("%s: Adaptive's rate never under its ceiling (%s min): the adaptive limit did not act", name, optText(f.AdaptiveBelowCeilingMin, "%.1f"))
			}
		}
	}
}
