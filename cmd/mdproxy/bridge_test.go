package main

// The bridge (issue 11), black-box: the built binary in front of the emulated Core,
// which really delivers its callbacks to the binary's callback listener.

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mdproxy/mdproxy/coresim"
	"github.com/mdproxy/mdproxy/internal/testkit/coretest"
	"github.com/mdproxy/mdproxy/internal/testkit/sidecartest"
)

// submit posts body to the proxy with headers and returns the data_id Core gave.
func submit(t *testing.T, c *http.Client, proxyURL, body string, headers map[string]string) string {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, proxyURL+"/file", strings.NewReader(body))
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("POST /file: %v", err)
	}
	defer resp.Body.Close()
	var out struct {
		DataID string `json:"data_id"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != http.StatusOK || out.DataID == "" {
		t.Fatalf("POST /file = %d, %v, data_id %q; want 200 with a data_id", resp.StatusCode, err, out.DataID)
	}
	return out.DataID
}

// poll is one GET /file/{id}: the status and the fields a client reads.
type poll struct {
	status   int
	verdict  int // scan_results.scan_all_result_i; -1 when absent
	progress int // process_info.progress_percentage
	result   string
	body     string
}

func getResult(t *testing.T, c *http.Client, proxyURL, id, apikey string) poll {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, proxyURL+"/file/"+id, nil)
	if apikey != "" {
		req.Header.Set("apikey", apikey)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("GET /file/%s: %v", id, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	p := poll{status: resp.StatusCode, verdict: -1, body: string(b)}
	var r struct {
		ScanResults *struct {
			ScanAllResultI *int `json:"scan_all_result_i"`
		} `json:"scan_results"`
		ProcessInfo struct {
			Progress int    `json:"progress_percentage"`
			Result   string `json:"result"`
		} `json:"process_info"`
	}
	if json.Unmarshal(b, &r) == nil {
		if r.ScanResults != nil && r.ScanResults.ScanAllResultI != nil {
			p.verdict = *r.ScanResults.ScanAllResultI
		}
		p.progress, p.result = r.ProcessInfo.Progress, r.ProcessInfo.Result
	}
	return p
}

// pollUntilFinal polls id every 20 ms until its answer is final, checking on the way
// that no answer is a 503 and none reads as a verdict before the scan is over.
func pollUntilFinal(t *testing.T, c *http.Client, proxyURL, id, apikey string) poll {
	t.Helper()
	deadline := time.Now().Add(safety)
	for {
		p := getResult(t, c, proxyURL, id, apikey)
		switch {
		case p.status != http.StatusOK:
			t.Fatalf("poll of a submitted id = %d %s, want 200 (never a limit answer for a submitted file)", p.status, sidecartest.Short(p.body))
		case p.progress == 100:
			return p
		case p.verdict != 255 || p.result != "Processing":
			t.Fatalf("in-progress answer with scan_all_result_i %d, result %q: %s; want 255 and Processing (nothing that reads as a verdict)", p.verdict, p.result, sidecartest.Short(p.body))
		}
		if time.Now().After(deadline) {
			t.Fatalf("id %s not final after %v", id, safety)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestBridgeAnswersFromCallbacks: a polling client's unchanged loop gets every result,
// never a 503 although the limit is tight, and Core is asked about none of them: the
// results came by callback.
func TestBridgeAnswersFromCallbacks(t *testing.T) {
	core := coretest.Start(t, coretest.Fast(), coresim.StartOptions{})
	p := startBinary(t, core.URL, map[string]string{
		"MDPROXY_BRIDGE_LISTEN_ADDR": "127.0.0.1:0",
		"MDPROXY_FILE_RESULT_RATE":   "0.1", "MDPROXY_FILE_RESULT_BURST": "1",
	})
	c := sidecartest.NewClient(t)
	files := map[string]string{"clean": "hello, world", "infected": `X5O!P%@AP[4\PZX54(P^)7CC)7}$EICAR-STANDARD-ANTIVIRUS-TEST-FILE!$H+H*`}
	ids := map[string]string{}
	for name, body := range files {
		ids[name] = submit(t, c, p.proxyURL, body, nil)
	}
	var wg sync.WaitGroup
	final := map[string]poll{}
	var mu sync.Mutex
	for name, id := range ids {
		wg.Go(func() {
			r := pollUntilFinal(t, c, p.proxyURL, id, "")
			mu.Lock()
			final[name] = r
			mu.Unlock()
		})
	}
	wg.Wait()
	if got := final["clean"].verdict; got != 0 {
		t.Errorf("clean file's verdict = %d, want 0", got)
	}
	if got := final["infected"].verdict; got != 1 {
		t.Errorf("EICAR's verdict = %d, want 1", got)
	}
	if n := core.Polls(); n != 0 {
		t.Errorf("polls that reached Core = %d, want 0 (results came by callback)", n)
	}
	waitMetricAtLeast(t, p, series("mdproxy_bridge_callbacks_total", "outcome", "stored"), 2)
	waitMetricAtLeast(t, p, series("mdproxy_bridge_polls_total", "source", "store"), 2)
	if v := p.metric(t, series("mdproxy_requests_total", "code", "503", "method", "GET", "route", "file_result")); v != 0 {
		t.Errorf("503 answers to polls of submitted files = %v, want 0", v)
	}
	if t.Failed() {
		t.Logf("mdproxy's metrics:\n%s\nmdproxy's log:\n%s", p.metrics(t), p.logs.String())
	}
}

// TestBridgeOwnerScoped: a client with another apikey is never served the stored
// result: its poll goes to Core, which decides.
func TestBridgeOwnerScoped(t *testing.T) {
	cfg := coretest.Fast()
	cfg.APIKey = "owner-key"
	core := coretest.Start(t, cfg, coresim.StartOptions{})
	p := startBinary(t, core.URL, map[string]string{"MDPROXY_BRIDGE_LISTEN_ADDR": "127.0.0.1:0"})
	c := sidecartest.NewClient(t)
	id := submit(t, c, p.proxyURL, "some file", map[string]string{"apikey": "owner-key"})
	pollUntilFinal(t, c, p.proxyURL, id, "owner-key")
	before := core.Polls()
	other := getResult(t, c, p.proxyURL, id, "another-key")
	if other.status != http.StatusForbidden {
		t.Errorf("poll with another apikey = %d %s, want Core's 403 (never the stored result)", other.status, sidecartest.Short(other.body))
	}
	if core.Polls() != before+1 {
		t.Errorf("polls reaching Core for another apikey = %d, want 1", core.Polls()-before)
	}
	if again := getResult(t, c, p.proxyURL, id, "owner-key"); again.status != http.StatusOK || again.progress != 100 {
		t.Errorf("owner's poll after = %d %s, want the stored result", again.status, sidecartest.Short(again.body))
	}
}

// TestBridgeLogoutEndsAnswers: a session that Core ended (POST /logout through mdproxy
// answered 200) is no longer answered from what the bridge kept for it: its polls go to
// Core, which answers 403, as it does without the bridge. Another session's polls of
// its own results are still answered from the store.
func TestBridgeLogoutEndsAnswers(t *testing.T) {
	cfg := coretest.Fast()
	cfg.APIKey = "master-key"
	core := coretest.Start(t, cfg, coresim.StartOptions{})
	p := startBinary(t, core.URL, nil)
	c := sidecartest.NewClient(t)
	login := func() string {
		t.Helper()
		resp, err := c.Post(p.proxyURL+"/login", "application/json", strings.NewReader(`{"user":"admin","password":"admin"}`))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var s struct {
			SessionID string `json:"session_id"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&s); err != nil || s.SessionID == "" {
			t.Fatalf("POST /login = %d, %v, want a session_id", resp.StatusCode, err)
		}
		return s.SessionID
	}
	ended, kept := login(), login()
	id := submit(t, c, p.proxyURL, "a file", map[string]string{"apikey": ended})
	other := submit(t, c, p.proxyURL, "another file", map[string]string{"apikey": kept})
	pollUntilFinal(t, c, p.proxyURL, id, ended)
	pollUntilFinal(t, c, p.proxyURL, other, kept)

	req, _ := http.NewRequest(http.MethodPost, p.proxyURL+"/logout", nil)
	req.Header.Set("apikey", ended)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST /logout = %d, want 200", resp.StatusCode)
	}
	before := core.Polls()
	if r := getResult(t, c, p.proxyURL, id, ended); r.status != http.StatusForbidden {
		t.Errorf("poll by the ended session = %d %s, want Core's 403 (never the stored result)", r.status, sidecartest.Short(r.body))
	}
	if core.Polls() != before+1 {
		t.Errorf("polls reaching Core for the ended session = %d, want 1", core.Polls()-before)
	}
	if r := getResult(t, c, p.proxyURL, other, kept); r.status != http.StatusOK || r.progress != 100 {
		t.Errorf("poll by the other session = %d %s, want its stored result", r.status, sidecartest.Short(r.body))
	}
	if core.Polls() != before+1 {
		t.Errorf("the other session's poll reached Core, want it answered from the store")
	}
}

// TestBridgeOwnCallbackURLUntouched: a submission with a callbackurl of its own is
// forwarded untouched and not bridged: Core calls the client back, and the proxy's
// polls go to Core.
func TestBridgeOwnCallbackURLUntouched(t *testing.T) {
	core := coretest.Start(t, coretest.Fast(), coresim.StartOptions{})
	got := make(chan string, 1)
	receiver := newLoopback(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case got <- r.URL.Path:
		default:
		}
	})
	p := startBinary(t, core.URL, map[string]string{"MDPROXY_BRIDGE_LISTEN_ADDR": "127.0.0.1:0"})
	c := sidecartest.NewClient(t)
	id := submit(t, c, p.proxyURL, "mine", map[string]string{"callbackurl": receiver.URL + "/mine"})
	select {
	case path := <-got:
		if path != "/mine" {
			t.Errorf("client's callback path = %q, want /mine", path)
		}
	case <-time.After(safety):
		t.Fatalf("the client's own callback never came")
	}
	if r := getResult(t, c, p.proxyURL, id, ""); r.status != http.StatusOK || r.progress != 100 {
		t.Errorf("poll of an unbridged id = %d %s, want Core's final answer", r.status, sidecartest.Short(r.body))
	}
	if core.Polls() == 0 {
		t.Errorf("polls reaching Core for an unbridged id = 0, want it asked")
	}
	if v := p.metric(t, series("mdproxy_bridge_callbacks_total", "outcome", "stored")); v != 0 {
		t.Errorf("callbacks stored by the proxy = %v, want 0 (not bridged)", v)
	}
}

// TestBridgeLostCallbacks: Core cannot reach the callback listener (a wrong callback
// URL): every result still comes home, asked of Core once the callbacks look overdue,
// and no poll of a submitted file is answered 503.
func TestBridgeLostCallbacks(t *testing.T) {
	core := coretest.Start(t, coretest.Fast(), coresim.StartOptions{})
	p := startBinary(t, core.URL, map[string]string{
		"MDPROXY_BRIDGE_LISTEN_ADDR":  "127.0.0.1:0",
		"MDPROXY_BRIDGE_CALLBACK_URL": "http://127.0.0.1:1", // nothing listens there
		"MDPROXY_BRIDGE_REFRESH":      "300ms",
		"MDPROXY_FILE_RESULT_RATE":    "5", "MDPROXY_FILE_RESULT_BURST": "1",
	})
	c := sidecartest.NewClient(t)
	var ids []string
	for i := range 5 {
		ids = append(ids, submit(t, c, p.proxyURL, strings.Repeat("x", 100+i), nil))
	}
	var wg sync.WaitGroup
	for _, id := range ids {
		wg.Go(func() {
			if r := pollUntilFinal(t, c, p.proxyURL, id, ""); r.verdict != 0 {
				t.Errorf("verdict of %s = %d, want 0", id, r.verdict)
			}
		})
	}
	wg.Wait()
	if core.Polls() == 0 {
		t.Errorf("polls reaching Core = 0, want Core asked once callbacks were overdue")
	}
	waitMetricAtLeast(t, p, series("mdproxy_bridge_polls_total", "source", "core"), float64(len(ids)))
}

// TestBridgeOff: MDPROXY_BRIDGE=false forwards every poll, as before the bridge.
func TestBridgeOff(t *testing.T) {
	core := coretest.Start(t, coretest.Fast(), coresim.StartOptions{})
	p := startBinary(t, core.URL, map[string]string{"MDPROXY_BRIDGE": "false"})
	c := sidecartest.NewClient(t)
	id := submit(t, c, p.proxyURL, "off", nil)
	getResult(t, c, p.proxyURL, id, "")
	if core.Polls() != 1 {
		t.Errorf("polls reaching Core with the bridge off = %d, want 1", core.Polls())
	}
}

// TestBridgeSecretNotShown: Core's webhook status shows a submission's callback URL;
// for a bridged one, the proxy relays it with the secret redacted, so that no reader of
// it can post a result in Core's place.
func TestBridgeSecretNotShown(t *testing.T) {
	core := coretest.Start(t, coretest.Fast(), coresim.StartOptions{})
	p := startBinary(t, core.URL, nil)
	c := sidecartest.NewClient(t)
	id := submit(t, c, p.proxyURL, "hello", nil)
	pollUntilFinal(t, c, p.proxyURL, id, "")
	resp, err := c.Get(p.proxyURL + "/file/webhook/" + id)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var status struct {
		URL string `json:"url"`
	}
	if err := json.Unmarshal(b, &status); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /file/webhook/%s = %d %s, %v; want Core's 200 JSON", id, resp.StatusCode, b, err)
	}
	if !strings.HasSuffix(status.URL, "/callback/redacted") {
		t.Errorf("webhook status url = %q, want the bridge's callback URL with its secret redacted", status.URL)
	}
	if resp.ContentLength != int64(len(b)) {
		t.Errorf("webhook status Content-Length = %d, body %d bytes", resp.ContentLength, len(b))
	}
}
