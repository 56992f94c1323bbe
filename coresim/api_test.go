package coresim

import (
	"bytes"
	"fmt"
	"io"
	"math"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestAPIMissingContentLength checks POST /file without Content-Length answers 411,
// whether the body is chunked or absent, and never reaches the queue.
func TestAPIMissingContentLength(t *testing.T) {
	h := newAPIHarness(t, nil)
	const msg = "Missing Content-Length header."
	resp := h.do(t, apiCall{method: http.MethodPost, path: "/file", body: []byte("chunked body"), chunked: true,
		header: apiHeader("Content-Type", "application/octet-stream")})
	wantErrBody(t, "POST /file (client body of unknown length)", resp, http.StatusLengthRequired, msg)

	tests := []struct{ name, raw string }{
		{"raw chunked", "POST /file HTTP/1.1\r\nHost: core\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5\r\nhello\r\n0\r\n\r\n"},
		{"raw without Content-Length", "POST /file HTTP/1.1\r\nHost: core\r\nfilename: a.txt\r\nConnection: close\r\n\r\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp := rawExchange(t, h, http.MethodPost, "/file", tt.raw)
			wantErrBody(t, "POST /file ("+tt.name+")", resp, http.StatusLengthRequired, msg)
		})
	}
	if n := h.sim.model.QueueLen(); n != 0 {
		t.Errorf("scan queue after refused uploads = %d, want 0", n)
	}
}

// TestAPIEmpty checks an empty upload answers 422.
func TestAPIEmpty(t *testing.T) {
	h := newAPIHarness(t, nil)
	resp := h.post(t, "/file", []byte{}, "Content-Type", "application/octet-stream")
	wantErrBody(t, "POST /file (Content-Length: 0)", resp, http.StatusUnprocessableEntity, "File is empty.")
	resp = rawExchange(t, h, http.MethodPost, "/file", "POST /file HTTP/1.1\r\nHost: core\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
	wantErrBody(t, "POST /file (raw, Content-Length: 0)", resp, http.StatusUnprocessableEntity, "File is empty.")
}

// TestAPICallbackURL checks which callback URLs are refused with 400.
func TestAPICallbackURL(t *testing.T) {
	h := newAPIHarness(t, nil)
	tests := []struct {
		url    string
		status int
	}{
		{"ftp://x", 400},
		{"not a url", 400},
		{"http://", 400},
		{"http://:8080/path", 400},
		{"mailto:core@example.com", 400},
		{"http://h:99999/x", 400},
		{"http://h:0/x", 400},
		{"http://h:/x", 400},
		{"http://h/ x", 400},
		{"http://h/x\ty", 400},
		{"http://127.0.0.1:9/listenback", 200},
		{"https://hooks.example.com/core", 200},
	}
	for _, tt := range tests {
		t.Run(tt.url, func(t *testing.T) {
			resp := h.post(t, "/file", []byte("payload"), "Content-Type", "application/octet-stream", "callbackurl", tt.url)
			if tt.status == 400 {
				wantErrBody(t, fmt.Sprintf("POST /file (callbackurl %q)", tt.url), resp, 400, "Callback url is invalid.")
			} else if resp.status != tt.status {
				t.Errorf("POST /file (callbackurl %q) = %d %s, want %d", tt.url, resp.status, resp.body, tt.status)
			}
		})
	}
}

// TestAPIQueueFull checks POST /file answers 503 once QueueSize files wait, and takes
// files again once the cores have taken some.
func TestAPIQueueFull(t *testing.T) {
	h := newAPIHarness(t, func(c *Config) { c.QueueSize, c.Cores = 3, 1 })
	for i := range 3 {
		h.submit(t, []byte(fmt.Sprintf("file %d", i)))
	}
	for i := range 2 { // nothing advances: still full
		resp := h.post(t, "/file", []byte("one too many"), "Content-Type", "application/octet-stream")
		wantErrBody(t, fmt.Sprintf("POST /file (queue full, try %d)", i+1), resp, 503, "Server is too busy. Try again later.")
	}
	h.sim.advance(time.Millisecond) // the one core takes the first file
	if n := h.sim.model.QueueLen(); n != 2 {
		t.Fatalf("QueueLen() after one file started = %d, want 2", n)
	}
	h.submit(t, []byte("room again"))
}

// TestAPIUnknownDataID checks an unknown data_id answers 404 {"err":"Not found"}.
func TestAPIUnknownDataID(t *testing.T) {
	h := newAPIHarness(t, nil)
	for _, id := range []string{"0123456789abcdef0123456789abcdef", "nope"} {
		wantErrBody(t, "GET /file/"+id, h.get(t, "/file/"+id), 404, "Not found")
	}
}

// TestAPIProgress checks progress rises monotonically as virtual time passes, that
// scan_results and process_info agree, and that it reaches 100 with the final verdict.
func TestAPIProgress(t *testing.T) {
	h := newAPIHarness(t, func(c *Config) {
		c.Cores = 1
		exactTime(c)
	})
	body := ooxmlMedia(7, "", 1<<20) // 90 ms + 600 ms of scanning
	id := h.submit(t, body, "filename", "big.bin")
	last, seen := -1, map[int]bool{}
	for step := 0; ; step++ {
		if step == 1000 {
			t.Fatalf("GET /file/%s progress = %d after %v, want 100", id, last, h.sim.model.Now())
		}
		res := h.result(t, id)
		sp, pp := res.ScanResults.ProgressPercent, res.ProcessInfo.ProgressPercent
		if sp != pp {
			t.Errorf("GET /file/%s at %v: scan_results progress %d, process_info %d, want equal", id, h.sim.model.Now(), sp, pp)
		}
		if sp < last || sp > 100 {
			t.Errorf("GET /file/%s at %v: progress = %d after %d, want it rising up to 100", id, h.sim.model.Now(), sp, last)
		}
		last = sp
		seen[sp] = true
		if sp == 100 {
			if res.ScanResults.ScanAllResultI != 0 || res.ProcessInfo.Result != "Allowed" {
				t.Errorf("GET /file/%s at 100%% = %d %q, want 0 Allowed", id, res.ScanResults.ScanAllResultI, res.ProcessInfo.Result)
			}
			break
		}
		if res.ScanResults.ScanAllResultI != 255 || res.ProcessInfo.Result != "Processing" {
			t.Errorf("GET /file/%s at %d%% = %d %q, want 255 Processing", id, sp, res.ScanResults.ScanAllResultI, res.ProcessInfo.Result)
		}
		h.sim.advance(20 * time.Millisecond)
	}
	if len(seen) < 10 {
		t.Errorf("GET /file/%s went through %d progress values, want >= 10 steps on the way to 100", id, len(seen))
	}
}

// TestAPIInQueue checks in_queue counts the files ahead, and drops as files start or
// are canceled.
func TestAPIInQueue(t *testing.T) {
	h := newAPIHarness(t, func(c *Config) {
		c.Cores = 1
		exactTime(c)
	})
	ids := make([]string, 4)
	for i := range ids {
		ids[i] = h.submit(t, []byte(fmt.Sprintf("queued %d", i)))
	}
	inQueue := func(id string) int {
		t.Helper()
		res := h.result(t, id)
		if res.ScanResults.InQueue == nil {
			return -1
		}
		return *res.ScanResults.InQueue
	}
	check := func(when string, want []int) {
		t.Helper()
		for i, id := range ids {
			if want[i] == -2 {
				continue
			}
			if got := inQueue(id); got != want[i] {
				t.Errorf("%s: GET /file/<file %d> in_queue = %d, want %d (-1: absent)", when, i, got, want[i])
			}
		}
	}
	check("all queued", []int{0, 1, 2, 3})
	h.sim.advance(time.Millisecond)
	check("first started", []int{-1, 0, 1, 2})
	if resp := h.post(t, "/file/"+ids[2]+"/cancel", nil); resp.status != 200 {
		t.Fatalf("POST /file/<file 2>/cancel = %d %s, want 200", resp.status, resp.body)
	}
	check("third canceled", []int{-1, 0, -1, 1})
}

// TestAPICancel cancels a running scan: {"<id>":"cancelled"}, then 19/Canceled for
// good, and its core goes to the next file.
func TestAPICancel(t *testing.T) {
	h := newAPIHarness(t, func(c *Config) {
		c.Cores = 1
		exactTime(c)
	})
	a := h.submit(t, ooxmlMedia(8, "", 1<<20))
	b := h.submit(t, []byte("next"))
	h.sim.advance(100 * time.Millisecond)
	if p := h.result(t, a).ScanResults.ProgressPercent; p < 1 || p > 99 {
		t.Fatalf("GET /file/<a> before cancel progress = %d, want 1..99", p)
	}
	resp := h.post(t, "/file/"+a+"/cancel", nil)
	if want := `{"` + a + `":"cancelled"}`; resp.status != 200 || string(resp.body) != want {
		t.Errorf("POST /file/%s/cancel = %d %s, want 200 %s", a, resp.status, resp.body, want)
	}
	checkCanceled := func(when string) {
		t.Helper()
		res := h.result(t, a)
		if res.ScanResults.ScanAllResultI != 19 || res.ScanResults.ScanAllResultA != "Canceled" ||
			res.ScanResults.ProgressPercent != 100 || res.ProcessInfo.ProgressPercent != 100 ||
			res.ProcessInfo.Result != "Blocked" || res.ProcessInfo.BlockedReason != "Canceled" {
			t.Errorf("%s: GET /file/%s = %d %q %d%%/%d%% %q (%q), want 19 Canceled 100%%/100%% Blocked (Canceled)", when, a,
				res.ScanResults.ScanAllResultI, res.ScanResults.ScanAllResultA, res.ScanResults.ProgressPercent,
				res.ProcessInfo.ProgressPercent, res.ProcessInfo.Result, res.ProcessInfo.BlockedReason)
		}
		for e, rep := range res.ScanResults.ScanDetails {
			if rep.ScanResultI != 19 {
				t.Errorf("%s: GET /file/%s scan_details[%s].scan_result_i = %d, want 19", when, a, e, rep.ScanResultI)
			}
		}
	}
	checkCanceled("just canceled")
	h.sim.advance(time.Millisecond)
	if res := h.result(t, b); res.ScanResults.InQueue != nil {
		t.Errorf("GET /file/<b> after the running scan was canceled: in_queue = %d, want absent (scanning)", *res.ScanResults.InQueue)
	}
	h.settle(t)
	checkCanceled("after the queue drained")
	if res := h.result(t, b); res.ScanResults.ScanAllResultI != 0 {
		t.Errorf("GET /file/<b> = %d, want 0", res.ScanResults.ScanAllResultI)
	}
	for _, id := range []string{a, b} {
		wantErrBody(t, "POST /file/<done>/cancel", h.post(t, "/file/"+id+"/cancel", nil), 400, "The scan already finished.")
	}
	wantErrBody(t, "POST /file/<unknown>/cancel", h.post(t, "/file/0123456789abcdef0123456789abcdef/cancel", nil), 404, "Not found")
}

// TestAPIHashLookup checks GET /hash/{hash} finds the latest scan by md5, sha1 or
// sha256 (in either case) and answers 200 {"<hash>":"Not Found"} on a miss.
func TestAPIHashLookup(t *testing.T) {
	h := newAPIHarness(t, nil) // default poll costs: the harness serves them
	body := []byte("hash me")
	h.submit(t, body)
	id := h.submit(t, body) // the same content again: the look-up answers the latest
	h.settle(t)
	md, s1, s256 := hashesOf(body)
	for _, hash := range []string{md, s1, s256, strings.ToUpper(s256)} {
		resp := h.get(t, "/hash/"+hash)
		var res analysisResult
		resp.decode(t, &res)
		if resp.status != 200 || res.DataID != id || res.FileInfo.SHA256 != s256 || res.ScanResults.ProgressPercent != 100 {
			t.Errorf("GET /hash/%s = %d data_id %s, want 200 %s complete", hash, resp.status, res.DataID, id)
		}
	}
	miss := strings.Repeat("0", 64)
	resp := h.get(t, "/hash/"+miss)
	if want := `{"` + miss + `":"Not Found"}`; resp.status != 200 || string(resp.body) != want {
		t.Errorf("GET /hash/%s = %d %s, want 200 %s", miss, resp.status, resp.body, want)
	}
}

// TestAPIConverted checks the sanitized download streams exactly file_size bytes with
// Content-Length, the same bytes each time, and only for a complete scan.
func TestAPIConverted(t *testing.T) {
	h := newAPIHarness(t, nil)
	const size = 100_000
	id := h.submit(t, ooxmlMedia(10, "", size), "filename", `quoted"name.bin`)
	other := h.submit(t, []byte("canceled"))
	h.post(t, "/file/"+other+"/cancel", nil)
	wantErrBody(t, "GET /file/converted/<in progress>", h.get(t, "/file/converted/"+id), 404, "Not found")
	h.settle(t)
	first := h.get(t, "/file/converted/"+id)
	if first.status != 200 || len(first.body) != size || first.header.Get("Content-Length") != strconv.Itoa(size) ||
		first.header.Get("Content-Type") != "application/octet-stream" {
		t.Errorf("GET /file/converted/%s = %d, %d bytes, Content-Length %q, Content-Type %q; want 200, %d, %d, application/octet-stream",
			id, first.status, len(first.body), first.header.Get("Content-Length"), first.header.Get("Content-Type"), size, size)
	}
	if cd := first.header.Get("Content-Disposition"); cd != `attachment; filename="quotedname.bin"` {
		t.Errorf("GET /file/converted/%s Content-Disposition = %q, want the name without its quote", id, cd)
	}
	if again := h.get(t, "/file/converted/"+id); !bytes.Equal(again.body, first.body) {
		t.Errorf("GET /file/converted/%s twice: different bytes, want the same stand-in", id)
	}
	wantErrBody(t, "GET /file/converted/<canceled>", h.get(t, "/file/converted/"+other), 404, "Not found")
	wantErrBody(t, "GET /file/converted/<unknown>", h.get(t, "/file/converted/0123456789abcdef0123456789abcdef"), 404, "Not found")
}

// TestAPIBatchPages submits 120 files to a batch and reads its status in pages of 50.
func TestAPIBatchPages(t *testing.T) {
	h := newAPIHarness(t, nil) // default batch costs: the harness serves them
	resp := h.post(t, "/file/batch", nil)
	var open struct {
		BatchID string `json:"batch_id"`
	}
	resp.decode(t, &open)
	if resp.status != 200 || len(open.BatchID) != 32 {
		t.Fatalf("POST /file/batch = %d %s, want 200 with a batch_id", resp.status, resp.body)
	}
	batch := open.BatchID
	ids := make([]string, 120)
	for i := range ids {
		ids[i] = h.submit(t, []byte(fmt.Sprintf("batch file %d", i)), "batch", batch, "filename", fmt.Sprintf("f%03d.txt", i))
	}
	var got []string
	for _, tt := range []struct{ first, n int }{{0, 50}, {50, 50}, {100, 20}, {150, 0}} {
		resp := h.get(t, fmt.Sprintf("/file/batch/%s?first=%d", batch, tt.first))
		var st batchResponse
		resp.decode(t, &st)
		bf := st.BatchFiles
		if resp.status != 200 || st.BatchID != batch || bf.BatchCount != 120 || bf.FirstIndex != tt.first ||
			bf.PageSize != 50 || len(bf.FilesInBatch) != tt.n || st.IsClosed {
			t.Errorf("GET /file/batch/%s?first=%d = %d id %s count %d first %d page_size %d, %d files, closed %t; want 200 %s 120 %d 50, %d files, open",
				batch, tt.first, resp.status, st.BatchID, bf.BatchCount, bf.FirstIndex, bf.PageSize, len(bf.FilesInBatch), st.IsClosed, batch, tt.first, tt.n)
		}
		for _, f := range bf.FilesInBatch {
			got = append(got, f.DataID)
		}
	}
	if strings.Join(got, ",") != strings.Join(ids, ",") {
		t.Errorf("GET /file/batch/%s pages list %d files, want the 120 submitted in order", batch, len(got))
	}

	resp = h.post(t, "/file/batch/"+batch+"/close", nil)
	var closed batchResponse
	resp.decode(t, &closed)
	if resp.status != 200 || !closed.IsClosed {
		t.Errorf("POST /file/batch/%s/close = %d is_closed %t, want 200 true", batch, resp.status, closed.IsClosed)
	}
	var st batchResponse
	h.get(t, "/file/batch/"+batch).decode(t, &st)
	if !st.IsClosed {
		t.Errorf("GET /file/batch/%s after close: is_closed = false, want true", batch)
	}
	const refused = "Invalid batch id or batch closed."
	wantErrBody(t, "POST /file (closed batch)", h.post(t, "/file", []byte("late"), "Content-Type", "application/octet-stream", "batch", batch), 400, refused)
	wantErrBody(t, "POST /file (unknown batch)", h.post(t, "/file", []byte("lost"), "Content-Type", "application/octet-stream", "batch", "no-such-batch"), 400, refused)

	h.settle(t)
	h.get(t, "/file/batch/"+batch).decode(t, &st)
	if st.ProcessInfo.Result != "Allowed" || st.ScanResults.ScanAllResultI != 0 {
		t.Errorf("GET /file/batch/%s (closed, all clean) = %q %d, want Allowed 0", batch, st.ProcessInfo.Result, st.ScanResults.ScanAllResultI)
	}
	cert := h.get(t, "/file/batch/"+batch+"/certificate")
	for _, want := range []string{"batch_id: " + batch, "is_closed: true", "files: 120", "result: Allowed"} {
		if cert.status != 200 || !bytes.Contains(cert.body, []byte(want)) {
			t.Errorf("GET /file/batch/%s/certificate = %d %q, want 200 with %q", batch, cert.status, cert.body, want)
		}
	}
}

// TestAPIAuth checks apikey enforcement: 403 without it, the key or a live session
// accepted, a session refused after logout.
func TestAPIAuth(t *testing.T) {
	h := newAPIHarness(t, func(c *Config) {
		c.APIKey = "secret"
		exactTime(c)
	})
	const denied = "Access denied"
	octet := []string{"Content-Type", "application/octet-stream"}
	for _, c := range []apiCall{
		{method: "POST", path: "/file", body: []byte("x"), header: apiHeader(octet...)},
		{method: "GET", path: "/file/0123456789abcdef0123456789abcdef"},
		{method: "GET", path: "/hash/" + strings.Repeat("a", 32)},
		{method: "POST", path: "/file/batch"},
		{method: "GET", path: "/version"},
		{method: "GET", path: "/stat/nodes"},
		{method: "POST", path: "/logout"},
	} {
		wantErrBody(t, c.method+" "+c.path+" (no apikey)", h.do(t, c), 403, denied)
	}
	wantErrBody(t, "POST /file (wrong apikey)", h.post(t, "/file", []byte("x"), append(octet, "apikey", "secret2")...), 403, denied)
	h.submit(t, []byte("with the key"), "apikey", "secret")
	if resp := h.get(t, "/readyz"); resp.status != 200 {
		t.Errorf("GET /readyz (no apikey) = %d, want 200: readiness is open", resp.status)
	}

	wantErrBody(t, "POST /login (wrong password)", h.post(t, "/login", []byte(`{"user":"admin","password":"nimda"}`), "Content-Type", "application/json"), 403, "Failed to login")
	wantErrBody(t, "POST /login (not JSON)", h.post(t, "/login", []byte(`user=admin`), "Content-Type", "application/json"), 403, "Failed to login")
	resp := h.post(t, "/login", []byte(`{"user":"admin","password":"admin"}`), "Content-Type", "application/json")
	var login struct {
		SessionID string `json:"session_id"`
	}
	resp.decode(t, &login)
	if resp.status != 200 || len(login.SessionID) != 32 {
		t.Fatalf("POST /login = %d %s, want 200 with a session_id", resp.status, resp.body)
	}
	id := h.submit(t, []byte("with a session"), "apikey", login.SessionID)
	if resp := h.get(t, "/file/"+id, "apikey", login.SessionID); resp.status != 200 {
		t.Errorf("GET /file/%s (session) = %d, want 200", id, resp.status)
	}
	resp = h.post(t, "/logout", nil, "apikey", login.SessionID)
	if want := `{"response":"Logout success"}`; resp.status != 200 || string(resp.body) != want {
		t.Errorf("POST /logout = %d %s, want 200 %s", resp.status, resp.body, want)
	}
	wantErrBody(t, "GET /file/<id> (session after logout)", h.get(t, "/file/"+id, "apikey", login.SessionID), 403, denied)
	wantErrBody(t, "POST /file (session after logout)", h.post(t, "/file", []byte("x"), append(octet, "apikey", login.SessionID)...), 403, denied)
	if resp := h.get(t, "/file/"+id, "apikey", "secret"); resp.status != 200 {
		t.Errorf("GET /file/%s (key, after a logout) = %d, want 200", id, resp.status)
	}
}

// TestAPIReadyz checks /readyz is 200 up to ReadyOccupancy of the queue and 503 above.
func TestAPIReadyz(t *testing.T) {
	h := newAPIHarness(t, func(c *Config) { c.QueueSize, c.ReadyOccupancy, c.Cores = 4, 0.5, 8 })
	want := func(when string, status int) {
		t.Helper()
		if resp := h.get(t, "/readyz"); resp.status != status {
			t.Errorf("GET /readyz (%s, %d queued) = %d %s, want %d", when, h.sim.model.QueueLen(), resp.status, resp.body, status)
		}
	}
	want("empty", 200)
	h.submit(t, []byte("1"))
	h.submit(t, []byte("2"))
	want("at the threshold", 200)
	h.submit(t, []byte("3"))
	want("above the threshold", 503)
	wantErrBody(t, "GET /readyz (above)", h.get(t, "/readyz"), 503, "Scan queue is over its threshold.")
	h.sim.advance(time.Millisecond) // 8 cores take the 3 files
	want("files started", 200)
}

// TestAPIVersionAndStats checks /version, /stat/nodes and /stat/engines answer JSON
// that reflects the configuration and the queue.
func TestAPIVersionAndStats(t *testing.T) {
	h := newAPIHarness(t, func(c *Config) {
		c.Cores = 1
		c.QueueSize = 10
		c.Engines = []string{"Alpha", "Vir.IT Explorer"}
	})
	var ver map[string]string
	resp := h.get(t, "/version")
	resp.decode(t, &ver)
	if resp.status != 200 || ver["product_id"] == "" || ver["version"] == "" {
		t.Errorf("GET /version = %d %s, want 200 with product_id and version", resp.status, resp.body)
	}
	for i := range 3 {
		h.submit(t, []byte(fmt.Sprintf("stat %d", i)))
	}
	h.sim.advance(time.Millisecond) // one core: one file scanning, two queued
	var nodes []struct {
		Statuses []struct {
			CPUCores  int `json:"cpu_cores"`
			ScanQueue int `json:"scan_queue"`
			Load      int `json:"load"`
			Details   struct {
				Total     int `json:"total_scan_queue"`
				Available int `json:"available_slots"`
			} `json:"scan_queue_details"`
			Engines []struct {
				EngName string `json:"eng_name"`
			} `json:"engines"`
		} `json:"statuses"`
	}
	resp = h.get(t, "/stat/nodes")
	resp.decode(t, &nodes)
	if resp.status != 200 || len(nodes) != 1 || len(nodes[0].Statuses) != 1 {
		t.Fatalf("GET /stat/nodes = %d %s, want 200 with one node", resp.status, resp.body)
	}
	if st := nodes[0].Statuses[0]; st.CPUCores != 1 || st.ScanQueue != 2 || st.Load != 100 || len(st.Engines) != 4 {
		t.Errorf("GET /stat/nodes node = cores %d, queue %d, load %d, %d engines; want 1, 2, 100, 4", st.CPUCores, st.ScanQueue, st.Load, len(st.Engines))
	}
	if d := nodes[0].Statuses[0].Details; d.Total != 2 || d.Available != 8 {
		t.Errorf("GET /stat/nodes scan_queue_details = %+v, want total_scan_queue 2, available_slots 8 (a queue of 10)", d)
	}
	for i := 0; i < 1000 && h.sim.model.QueueLen() > 0; i++ {
		h.sim.advance(time.Second) // the queue drains
	}
	resp = h.get(t, "/stat/nodes")
	resp.decode(t, &nodes)
	if st := nodes[0].Statuses[0]; st.ScanQueue != 0 || st.Details.Total != 0 || st.Details.Available != 10 {
		t.Errorf("GET /stat/nodes once drained = queue %d, details %+v, want 0, total 0, available 10", st.ScanQueue, st.Details)
	}
	var engines []map[string]any
	resp = h.get(t, "/stat/engines")
	resp.decode(t, &engines)
	var av []string
	for _, e := range engines {
		if e["engine_type"] == "av" {
			av = append(av, fmt.Sprintf("%v=%v", e["eng_name"], e["eng_id"]))
		}
	}
	if want := "Alpha=alpha_1_windows,Vir.IT Explorer=viritexplorer_1_windows"; resp.status != 200 || len(engines) != 4 || strings.Join(av, ",") != want {
		t.Errorf("GET /stat/engines = %d, %d engines, av %v; want 200, 4, %s", resp.status, len(engines), av, want)
	}
	for _, r := range []apiResp{h.get(t, "/version"), h.get(t, "/stat/nodes"), h.get(t, "/stat/engines"), h.get(t, "/file/rules")} {
		if ct := r.header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
			t.Errorf("Content-Type = %q, want application/json", ct)
		}
	}
}

// TestAPIPollCost checks a poll waits for its core time (it cannot answer before the
// model serves it) and charges exactly PollCostBase + entries × PollCostEntry, and a
// batch status PollCostBase + files × BatchCostFile.
func TestAPIPollCost(t *testing.T) {
	// No request latency: the poll goes straight to the cores.
	h := newAPIHarness(t, func(c *Config) { c.RequestLatency = 0 })
	cfg := h.sim.cfg
	id := h.submit(t, []byte("polled"))

	// The poll is booked but not served: it cannot have answered.
	answered := make(chan int, 1)
	go func() {
		resp, err := h.c.Get(h.srv.URL + "/file/" + id)
		if err != nil {
			answered <- -1
			return
		}
		resp.Body.Close()
		answered <- resp.StatusCode
	}()
	guard := time.Now().Add(30 * time.Second)
	for modelWaiting(h.sim.model) == 0 {
		if time.Now().After(guard) {
			t.Fatalf("GET /file/%s: not booked on the model after 30s", id)
		}
		runtime.Gosched()
	}
	select {
	case code := <-answered:
		t.Fatalf("GET /file/%s answered %d before the model served its core time, want it to wait", id, code)
	default:
	}
	var code int
serve:
	for {
		select {
		case code = <-answered:
			break serve
		default:
		}
		if modelWaiting(h.sim.model) > 0 {
			h.sim.advance(time.Millisecond)
		} else {
			runtime.Gosched()
		}
		if time.Now().After(guard) {
			t.Fatalf("GET /file/%s: no answer after 30s of real time", id)
		}
	}
	if code != 200 {
		t.Errorf("GET /file/%s = %d, want 200", id, code)
	}
	// Queued, nothing scanned yet: the result reports 1 object × 7 engines.
	_, _, spent := h.sim.model.Load()
	// The worker's receiving the request (RejectCost) is part of the poll's cost.
	want := (cfg.RejectCost + cfg.PollCostBase + time.Duration(len(cfg.Engines))*cfg.PollCostEntry).Seconds()
	if got := spent[workPoll]; math.Abs(got-want) > 1e-9 {
		t.Errorf("core time of one poll = %.6fs, want %.6fs", got, want)
	}

	resp := h.post(t, "/file/batch", nil)
	var open struct {
		BatchID string `json:"batch_id"`
	}
	resp.decode(t, &open)
	for i := range 3 {
		h.submit(t, []byte(fmt.Sprintf("batched %d", i)), "batch", open.BatchID)
	}
	h.get(t, "/file/batch/"+open.BatchID)
	_, _, spent = h.sim.model.Load()
	want = (cfg.RejectCost + cfg.PollCostBase + 3*cfg.BatchCostFile).Seconds()
	if got := spent[workBatchStatus]; math.Abs(got-want) > 1e-9 {
		t.Errorf("core time of one batch status of 3 files = %.6fs, want %.6fs", got, want)
	}
}

// TestAPIMethodNotAllowed checks that a known path asked with a method it does not
// serve answers 405 with Core's error body and an Allow header (RFC 9110 §15.5.6)
// listing the methods it serves, HEAD wherever GET is, and that each of those is served
// there. It runs the emulator as the binary does (Run, on a loopback port), with an
// apikey, which a 405 is answered before.
func TestAPIMethodNotAllowed(t *testing.T) {
	addrs, _ := startRun(t, map[string]string{"CORESIM_LISTEN_ADDR": "127.0.0.1:0", "CORESIM_ADMIN_ADDR": "", "CORESIM_APIKEY": "k"})
	base := "http://" + addrs.api.String()
	c := newClient(t)
	do := func(method, path string) apiResp {
		t.Helper()
		req, err := http.NewRequest(method, base+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("apikey", "k")
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatalf("%s %s: reading the body: %v", method, path, err)
		}
		return apiResp{status: resp.StatusCode, header: resp.Header, body: body}
	}
	for _, tc := range []struct{ method, path, allow string }{
		{http.MethodDelete, "/file/abc", "GET, HEAD"},
		{http.MethodPut, "/file", "POST"},
		{http.MethodHead, "/file", "POST"},
		{http.MethodPost, "/version", "GET, HEAD"},
		{http.MethodGet, "/login", "POST"},
		{http.MethodOptions, "/readyz", "GET, HEAD"},
		{http.MethodPatch, "/file/rules", "GET, HEAD"},
		{http.MethodGet, "/file/abc/cancel", "POST"},
		{http.MethodDelete, "/file/batch/b1", "GET, HEAD"},
		{http.MethodGet, "/file/batch/b1/close", "POST"},
	} {
		t.Run(tc.method+" "+tc.path, func(t *testing.T) {
			resp := do(tc.method, tc.path)
			what := tc.method + " " + tc.path
			if tc.method == http.MethodHead {
				if resp.status != http.StatusMethodNotAllowed || len(resp.body) != 0 {
					t.Errorf("%s = %d %q, want 405 without a body", what, resp.status, resp.body)
				}
			} else {
				wantErrBody(t, what, resp, http.StatusMethodNotAllowed, "Method not allowed")
			}
			if got := resp.header.Values("Allow"); len(got) != 1 || got[0] != tc.allow {
				t.Errorf("%s Allow = %q, want %q", what, got, tc.allow)
			}
			for _, m := range strings.Split(tc.allow, ", ") {
				if r := do(m, tc.path); r.status == http.StatusMethodNotAllowed {
					t.Errorf("%s %s = 405, though %s's Allow lists %s", m, tc.path, what, m)
				}
			}
		})
	}
}
