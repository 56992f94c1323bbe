package bridge

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/mdproxy/mdproxy/coresim"
	"github.com/mdproxy/mdproxy/internal/testkit/coretest"
	"github.com/mdproxy/mdproxy/internal/testkit/sidecartest"
)

func TestIsFinal(t *testing.T) {
	tests := []struct {
		body string
		want bool
	}{
		{`{"scan_results":{"progress_percentage":100},"process_info":{"progress_percentage":100}}`, true},
		{`{"scan_results":{"progress_percentage":100}}`, true},
		{`{"process_info":{"progress_percentage":100}}`, true},
		{`{"scan_results":{"progress_percentage":100,"scan_all_result_i":1},"process_info":{"progress_percentage":100,"result":"Blocked"}}`, true},
		{`{"scan_results":{"progress_percentage":100.0}}`, true},
		{`{"scan_results":{"progress_percentage":100},"process_info":{"progress_percentage":99}}`, false},
		{`{"scan_results":{"progress_percentage":0},"process_info":{"progress_percentage":100}}`, false},
		{`{"scan_results":{"progress_percentage":100,"scan_all_result_i":255}}`, false},
		{`{"scan_results":{"scan_all_result_i":0},"process_info":{"result":"Allowed"}}`, false},
		{`{"scan_results":{},"process_info":{}}`, false},
		{`{"scan_results":null,"process_info":{"progress_percentage":100}}`, true},
		{`{"scan_results":{"progress_percentage":"100"}}`, false},
		{`{"scan_results":{"progress_percentage":null}}`, false},
		{`{"scan_results":[100]}`, false},
		{`{}`, false},
		{`[]`, false},
		{`"100"`, false},
		{`null`, false},
		{``, false},
		{`{"scan_results":{"progress_percentage":100}`, false},
		{`{"scan_results":{"progress_percentage":100}} trailing`, false},
		{`{"1234":"Not Found"}`, false},
		{`{"err":"Not found"}`, false},
	}
	for _, tc := range tests {
		if got := IsFinal([]byte(tc.body)); got != tc.want {
			t.Errorf("IsFinal(%s) = %v, want %v", tc.body, got, tc.want)
		}
	}
	if !IsFinal(finalResult("x")) || !IsFinal(infectedResult("x")) || IsFinal(result("x", 50, 255)) {
		t.Errorf("IsFinal disagrees with the test's own results")
	}
}

func TestInProgress(t *testing.T) {
	for _, id := range []string{"8101abae27be4d63859c55d9e0ed0135", "", `quote"back\slash`, "<script>&", "é\u2028"} {
		body := InProgress(id)
		checkSchema(t, "InProgress("+id+")", body)
		var got struct {
			DataID      string         `json:"data_id"`
			ScanResults map[string]any `json:"scan_results"`
			ProcessInfo map[string]any `json:"process_info"`
		}
		if err := json.Unmarshal(body, &got); err != nil {
			t.Fatalf("InProgress(%q) = %s: %v", id, body, err)
		}
		if got.DataID != id {
			t.Errorf("InProgress(%q) data_id = %q", id, got.DataID)
		}
		want := map[string]map[string]any{
			"scan_results": {"scan_all_result_i": 255.0, "scan_all_result_a": "In Progress", "progress_percentage": 0.0},
			"process_info": {"result": "Processing", "progress_percentage": 0.0},
		}
		for k, v := range want["scan_results"] {
			if got.ScanResults[k] != v {
				t.Errorf("InProgress(%q) scan_results.%s = %v, want %v", id, k, got.ScanResults[k], v)
			}
		}
		for k, v := range want["process_info"] {
			if got.ProcessInfo[k] != v {
				t.Errorf("InProgress(%q) process_info.%s = %v, want %v", id, k, got.ProcessInfo[k], v)
			}
		}
		// Nothing that reads as a verdict: no more fields than these.
		if len(got.ScanResults) != 3 || len(got.ProcessInfo) != 2 {
			t.Errorf("InProgress(%q) = %s, want only the in-progress fields", id, body)
		}
		if IsFinal(body) {
			t.Errorf("IsFinal(InProgress(%q)) = true", id)
		}
	}
}

// coresimRig is coresim on loopback, its virtual time driven fast, with a bridge whose
// callback listener is on loopback too.
type coresimRig struct {
	core     *coresim.Server
	client   *http.Client // to Core
	listener *httptest.Server
	b        *Bridge
	store    *MemoryStore
}

func newCoresimRig(t *testing.T) *coresimRig {
	t.Helper()
	core := coretest.Start(t, coretest.Fast(), coresim.StartOptions{})

	store, err := NewMemoryStore(16<<20, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(store.Close)
	r := &coresimRig{core: core, client: sidecartest.NewClient(t), store: store}
	r.listener = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.b.Handler().ServeHTTP(w, req)
	}))
	t.Cleanup(r.listener.Close)
	r.b, err = New(Options{CallbackURL: r.listener.URL, Store: store})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// submit posts content to coresim, as the proxy would with the bridge on: with the
// bridge's callbackurl, then Submitted. It returns the data_id.
func (r *coresimRig) submit(t *testing.T, name string, content []byte, owner Owner) string {
	t.Helper()
	cb, secret, err := r.b.Callback()
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequest(http.MethodPost, r.core.URL+"/file", bytes.NewReader(content))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("filename", name)
	req.Header.Set("callbackurl", cb)
	resp, err := r.client.Do(req)
	if err != nil {
		t.Fatalf("POST /file: %v", err)
	}
	defer resp.Body.Close()
	var got struct {
		DataID string `json:"data_id"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&got); err != nil || resp.StatusCode != http.StatusOK || got.DataID == "" {
		t.Fatalf("POST /file = %d, %+v, %v; want 200 and a data_id", resp.StatusCode, got, err)
	}
	r.b.Submitted(got.DataID, secret, owner)
	return got.DataID
}

// fetch is GET /file/{dataID} from coresim.
func (r *coresimRig) fetch(t *testing.T, dataID string) ([]byte, string) {
	t.Helper()
	resp, err := r.client.Get(r.core.URL + "/file/" + dataID)
	if err != nil {
		t.Fatalf("GET /file/%s: %v", dataID, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /file/%s = %d, %v", dataID, resp.StatusCode, err)
	}
	return body, resp.Header.Get("Content-Type")
}

// TestCoresimCallbacks runs the bridge against coresim: coresim posts each final result
// to the bridge's listener, which stores it; the stored answers and coresim's own
// answers validate against OPSWAT's schema and agree on the verdict; only the submitter
// is served them.
func TestCoresimCallbacks(t *testing.T) {
	r := newCoresimRig(t)
	eicar := []byte(`X5O!P%@AP[4\PZX54(P^)7CC)7}$EICAR-STANDARD-ANTIVIRUS-TEST-FILE!$H+H*`)
	files := []struct {
		name    string
		content []byte
		verdict float64
	}{
		{"clean.txt", []byte("hello, bridge\n"), 0},
		{"eicar.com", eicar, 1},
	}
	ids := make([]string, len(files))
	for i, f := range files {
		ids[i] = r.submit(t, f.name, f.content, alice)
	}
	deadline := time.Now().Add(30 * time.Second)
	for i, id := range ids {
		var a Answer
		for {
			a = r.b.Poll(id, alice)
			if a.Source == Stored {
				break
			}
			if a.Source != Pending {
				t.Fatalf("Poll(%s) = %v while waiting for its callback, want pending", files[i].name, a.Source)
			}
			checkSchema(t, "the pending answer", a.Body)
			if time.Now().After(deadline) {
				t.Fatalf("no callback stored for %s within 30 s; callbacks %v", files[i].name, r.b.Callbacks())
			}
			time.Sleep(5 * time.Millisecond)
		}
		checkSchema(t, "the stored answer of "+files[i].name, a.Body)
		if !IsFinal(a.Body) {
			t.Errorf("the stored answer of %s is not final: %s", files[i].name, a.Body)
		}
		var got struct {
			DataID      string `json:"data_id"`
			ScanResults struct {
				I float64 `json:"scan_all_result_i"`
			} `json:"scan_results"`
		}
		if err := json.Unmarshal(a.Body, &got); err != nil || got.DataID != id || got.ScanResults.I != files[i].verdict {
			t.Errorf("stored answer of %s: data_id %q, scan_all_result_i %v (%v), want %s, %v", files[i].name, got.DataID, got.ScanResults.I, err, id, files[i].verdict)
		}
		if !strings.HasPrefix(a.ContentType, "application/json") {
			t.Errorf("stored content type %q, want JSON", a.ContentType)
		}
		if b := r.b.Poll(id, bob); b.Source != Miss {
			t.Errorf("Poll(%s) by another owner = %v, want miss", files[i].name, b.Source)
		}

		// Core's own answer to a poll: valid, final, the same verdict; observed, it is
		// stored for the client that polled.
		body, ct := r.fetch(t, id)
		checkSchema(t, "coresim's GET /file/{data_id}", body)
		if !IsFinal(body) {
			t.Errorf("coresim's final answer is not final by IsFinal: %s", body)
		}
		r.b.Observe(id, bob, body, ct)
		if got := r.b.Poll(id, alice); got.Source != Stored || !bytes.Equal(got.Body, a.Body) {
			t.Errorf("after another owner's poll, Poll by the submitter = %v, want its stored answer unchanged", got.Source)
		}
	}
	if c := r.b.Callbacks(); c[OutcomeStored] != float64(len(files)) || c[OutcomeForged] != 0 || c[OutcomeInvalid] != 0 {
		t.Errorf("Callbacks() = %v, want %d stored and nothing else", c, len(files))
	}
	if n := r.b.PendingLen(); n != 0 {
		t.Errorf("PendingLen() = %d, want 0", n)
	}
}

// TestCoresimObserve stores a final answer from coresim observed by the bridge, for an
// id submitted without the bridge's callback (an unknown id).
func TestCoresimObserve(t *testing.T) {
	r := newCoresimRig(t)
	req, _ := http.NewRequest(http.MethodPost, r.core.URL+"/file", strings.NewReader("no callback\n"))
	resp, err := r.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var sub struct {
		DataID string `json:"data_id"`
	}
	err = json.NewDecoder(resp.Body).Decode(&sub)
	resp.Body.Close()
	if err != nil || sub.DataID == "" {
		t.Fatalf("POST /file: %v", err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		body, ct := r.fetch(t, sub.DataID)
		checkSchema(t, "coresim's GET /file/{data_id}", body)
		r.b.Observe(sub.DataID, alice, body, ct)
		a := r.b.Poll(sub.DataID, alice)
		if IsFinal(body) {
			if a.Source != Stored || !bytes.Equal(a.Body, body) || a.ContentType != ct {
				t.Errorf("Poll after observing the final answer = %v %q, want it stored byte for byte", a.Source, a.ContentType)
			}
			return
		}
		if a.Source != Miss {
			t.Fatalf("Poll of an unknown id after a non-final answer = %v, want miss", a.Source)
		}
		if time.Now().After(deadline) {
			t.Fatalf("coresim did not finish the scan within 30 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
