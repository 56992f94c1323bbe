package bridge

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/mdproxy/mdproxy/internal/openapifix"
)

// fakeClock is a clock that moves only when told, for the bridge (Now) and for otter
// (NowNano, and Tick without ticks: no clean-up goroutine). Safe for concurrent use.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{t: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func (c *fakeClock) NowNano() int64 { return c.Now().UnixNano() }

func (c *fakeClock) Tick(time.Duration) <-chan time.Time { return nil }

// testBridge is a Bridge on a fake clock with a MemoryStore on the same clock.
type testBridge struct {
	*Bridge
	store *MemoryStore
	clock *fakeClock
}

// newTestBridge returns a Bridge with o's settings (CallbackURL, Store and Now filled
// in) over a 64 MiB, 24 h MemoryStore, both on a fake clock.
func newTestBridge(t testing.TB, o Options) testBridge {
	t.Helper()
	clock := newFakeClock()
	store, err := newMemoryStore(64<<20, 24*time.Hour, clock)
	if err != nil {
		t.Fatalf("newMemoryStore = %v, want no error", err)
	}
	t.Cleanup(store.Close)
	if o.CallbackURL == "" {
		o.CallbackURL = "http://127.0.0.1:9010"
	}
	o.Store = store
	o.Now = clock.Now
	b, err := New(o)
	if err != nil {
		t.Fatalf("New(%+v) = %v, want no error", o, err)
	}
	return testBridge{b, store, clock}
}

// submit registers a new submission of dataID by owner and returns its secret.
func (tb testBridge) submit(t testing.TB, dataID string, owner Owner) string {
	t.Helper()
	_, secret, err := tb.Callback()
	if err != nil {
		t.Fatalf("Callback() = %v, want no error", err)
	}
	tb.Submitted(dataID, secret, owner)
	return secret
}

// result renders a Core result for dataID at progress (both fields), with verdict as
// scan_all_result_i, in the shape coresim answers.
func result(dataID string, progress, verdict int) []byte {
	text := map[int]string{0: "No Threat Detected", 1: "Infected", 255: "In Progress"}[verdict]
	result := "Allowed"
	if progress < 100 {
		result = "Processing"
	} else if verdict != 0 {
		result = "Blocked"
	}
	b, _ := json.Marshal(map[string]any{
		"data_id": dataID,
		"scan_results": map[string]any{
			"scan_all_result_i": verdict, "scan_all_result_a": text,
			"progress_percentage": progress, "total_avs": 2, "scan_details": map[string]any{},
		},
		"process_info": map[string]any{"result": result, "progress_percentage": progress, "profile": "File process"},
		"file_info":    map[string]any{"display_name": "a.txt", "file_size": 1},
	})
	return b
}

func finalResult(dataID string) []byte    { return result(dataID, 100, 0) }
func infectedResult(dataID string) []byte { return result(dataID, 100, 1) }

// specPath is OPSWAT's OpenAPI description of Core, vendored in coresim.
var specPath = filepath.Join("..", "coresim", "testdata", "openapi", "openapi.yaml")

// loadAnalysisSchema loads, once, the schema of GET /file/{data_id} 200 from the spec,
// with the spec's one defect that matters here patched as coresim's contract test does:
// its string enumeration of scan results lacks "No Threat Detected", which Core sends
// for scan_all_result_i 0 (docs/core-api.md, Results). The spec's examples are not
// validated: one of them is wrong (coresim/contract_test.go, defect 3).
var loadAnalysisSchema = sync.OnceValues(func() (*openapi3.Schema, error) {
	loader := openapi3.NewLoader()
	loader.IsExternalRefsAllowed = true
	doc, err := loader.LoadFromFile(specPath)
	if err != nil {
		return nil, fmt.Errorf("loading %s: %w", specPath, err)
	}
	if n := openapifix.AddNoThreatDetected(doc); n == 0 {
		return nil, fmt.Errorf(`%s: no schema enumerates "Threat Detected": the spec changed, revisit the patch`, specPath)
	}
	pi := doc.Paths.Value("/file/{data_id}")
	if pi == nil || pi.Get == nil {
		return nil, fmt.Errorf("%s: no GET /file/{data_id}", specPath)
	}
	resp := pi.Get.Responses.Status(200)
	if resp == nil || resp.Value == nil || resp.Value.Content.Get("application/json") == nil {
		return nil, fmt.Errorf("%s: no JSON answer 200 to GET /file/{data_id}", specPath)
	}
	ref := resp.Value.Content.Get("application/json").Schema
	if err := ref.Value.Validate(context.Background(), openapi3.DisableExamplesValidation()); err != nil {
		return nil, fmt.Errorf("%s: the result schema: %w", specPath, err)
	}
	return ref.Value, nil
})

// checkSchema fails the test unless body is a JSON object valid against OPSWAT's schema
// of GET /file/{data_id} 200.
func checkSchema(t *testing.T, what string, body []byte) {
	t.Helper()
	schema, err := loadAnalysisSchema()
	if err != nil {
		t.Fatalf("loading the result schema: %v", err)
	}
	var v any
	if err := json.Unmarshal(body, &v); err != nil {
		t.Fatalf("%s is not JSON: %v\n%s", what, err, body)
	}
	if _, ok := v.(map[string]any); !ok {
		t.Fatalf("%s is %T, want a JSON object", what, v)
	}
	if err := schema.VisitJSON(v); err != nil {
		t.Errorf("%s does not validate against OPSWAT's schema of GET /file/{data_id}: %v\n%s", what, err, body)
	}
}
