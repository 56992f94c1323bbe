package deploy

import (
	"maps"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/mdproxy/mdproxy/sidecar"
)

// Margins of the memory the manifests give mdproxy above the memory table of docs/operations.md: the
// garbage collector's room between the total and GOMEMLIMIT, what the Redis client's
// connections add with MDPROXY_REDIS_URL, and what is not Go's heap between GOMEMLIMIT
// and the container's memory limit.
const (
	gcMargin       = 64 << 20
	redisClientMem = 4 << 20
	nonHeapMargin  = 96 << 20
)

// readmeMemoryTotal returns the total of the memory table of docs/operations.md, in bytes, failing
// t when its rows do not add up to it.
func readmeMemoryTotal(t *testing.T) int64 {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n## Memory\n")
	if !ok {
		t.Fatal("docs/operations.md: no section Memory")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	var sum, total int64
	rows := 0
	for line := range strings.SplitSeq(section, "\n") {
		if !strings.HasPrefix(line, "| ") || strings.HasPrefix(line, "| what") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "| "), " | ")
		mib, err := strconv.ParseInt(strings.Trim(cells[len(cells)-1], "*"), 10, 64)
		if err != nil {
			t.Fatalf("docs/operations.md, Memory: row %q ends with no whole number of MiB", line)
		}
		if strings.Contains(cells[0], "total") {
			total = mib << 20
			continue
		}
		sum += mib << 20
		rows++
	}
	if rows < 5 || total == 0 || sum != total {
		t.Fatalf("docs/operations.md, Memory: %d rows adding up to %d MiB, total %d MiB; want the rows to add up to the total", rows, sum>>20, total>>20)
	}
	return total
}

// goMemLimit returns a GOMEMLIMIT value ("896MiB") in bytes, 0 when it is none.
func goMemLimit(v string) int64 {
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"B", 1}} {
		if n, ok := strings.CutSuffix(v, u.suffix); ok {
			if x, err := strconv.ParseInt(n, 10, 64); err == nil {
				return x * u.mult
			}
			return 0
		}
	}
	return 0
}

// TestManifestMemoryFitsREADME: the memory table of docs/operations.md adds up to its total, and the
// mdproxy containers of deploy/kubernetes/ (the sidecar and the gateway example), whose
// settings the table's rows count at their defaults, set GOMEMLIMIT at least gcMargin
// above that total (with Redis, redisClientMem more) and a memory limit at least
// nonHeapMargin above GOMEMLIMIT.
func TestManifestMemoryFitsREADME(t *testing.T) {
	total := readmeMemoryTotal(t)
	found := 0
	for _, dir := range []string{"kubernetes", filepath.Join("kubernetes", "gateway")} {
		found += checkMemory(t, dir, readObjects(t, dir), total)
	}
	if found != 2 {
		t.Errorf("%d mdproxy containers in deploy/kubernetes/ and its gateway example, want 2", found)
	}
}

// checkMemory checks the mdproxy containers of the Deployments among objects (from
// where) as TestManifestMemoryFitsREADME says, against the memory table's total, and
// returns how many it checked.
func checkMemory(t *testing.T, where string, objects map[string]k8sObject, total int64) int {
	t.Helper()
	defaults, err := sidecar.LoadConfig(map[string]string{})
	if err != nil {
		t.Fatal(err)
	}
	found := 0
	for key, o := range objects {
		if o.Kind != "Deployment" {
			continue
		}
		for _, c := range o.Spec.Template.Spec.Containers {
			if c.Name != "mdproxy" {
				continue
			}
			found++
			where := where + ": " + key
			env := podEnv(t, objects, c)
			settings := maps.Clone(env)
			delete(settings, "MDPROXY_LIMITS_FILE") // a path in the Pod; the limits weigh nothing here
			cfg, err := sidecar.LoadConfig(settings)
			if err != nil {
				t.Fatalf("%s: LoadConfig = %v", where, err)
			}
			if cfg.StoreMaxBytes != defaults.StoreMaxBytes || cfg.BridgePendingMaxBytes != defaults.BridgePendingMaxBytes ||
				cfg.MaxConnections != defaults.MaxConnections || cfg.ClientKeysMax != defaults.ClientKeysMax {
				t.Errorf("%s: MDPROXY_STORE_MAX_BYTES %d, MDPROXY_BRIDGE_PENDING_MAX_BYTES %d, MDPROXY_MAX_CONNECTIONS %d, MDPROXY_CLIENT_KEYS_MAX %d; want the defaults the memory table counts",
					where, cfg.StoreMaxBytes, cfg.BridgePendingMaxBytes, cfg.MaxConnections, cfg.ClientKeysMax)
			}
			need := total + gcMargin
			if env["MDPROXY_REDIS_URL"] != "" {
				need += redisClientMem
			}
			limit := goMemLimit(env["GOMEMLIMIT"])
			if limit < need {
				t.Errorf("%s: GOMEMLIMIT %q, want at least %d MiB: the memory table's %d MiB (docs/operations.md) and the collector's margin", where, env["GOMEMLIMIT"], need>>20, total>>20)
			}
			if mem := quantityBytes(c.Resources.Limits["memory"]); mem < limit+nonHeapMargin {
				t.Errorf("%s: memory limit %q, want at least %d MiB: GOMEMLIMIT and %d MiB for what is not Go's heap", where, c.Resources.Limits["memory"], (limit+nonHeapMargin)>>20, nonHeapMargin>>20)
			}
		}
	}
	return found
}
