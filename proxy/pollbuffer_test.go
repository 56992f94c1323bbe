package proxy

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mdproxy/mdproxy/bridge"
)

// paddedResult is a final, clean result of Core for dataID of size bytes (a pad field
// makes up the size; at least 200).
func paddedResult(dataID string, size int) []byte {
	head := `{"data_id":"` + dataID + `","scan_results":{"scan_all_result_i":0,"progress_percentage":100},"process_info":{"progress_percentage":100},"pad":"`
	return []byte(head + strings.Repeat("x", size-len(head)-2) + `"}`)
}

// bigResultCore is a Core whose answer to GET /file/{id} is paddedResult(id, size),
// with its Content-Length; it counts the polls of each id. A poll waits for release,
// when not nil, before answering.
type bigResultCore struct {
	size    int
	release chan struct{}
	mu      sync.Mutex
	asked   map[string]int
}

func (c *bigResultCore) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id := path.Base(r.URL.Path)
	c.mu.Lock()
	c.asked[id]++
	c.mu.Unlock()
	if c.release != nil {
		<-c.release
	}
	body := paddedResult(id, c.size)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	_, _ = w.Write(body)
}

func (c *bigResultCore) polls(id string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.asked[id]
}

// TestPollBufferBudget: Core's answers to bridged polls held in memory at once are
// bounded by Options.PollBufferBytes, slow clients included. While one client that
// reads nothing holds a 24 MiB result of a 32 MiB budget, another result of 24 MiB
// reaches its own client whole, as it comes, and is not stored (its next poll asks Core
// again); once the slow client has gone, the budget is free and the result is stored.
func TestPollBufferBudget(t *testing.T) {
	if testing.Short() {
		t.Skip("moves about 150 MiB through loopback")
	}
	const size = 24 << 20
	core := &bigResultCore{size: size, asked: map[string]int{}}
	b, _ := newTestBridgeStoreOf(t, 1<<30) // keeps results of up to 64 MiB
	budget := bridge.NewBudget(32 << 20)
	front, reg := newTestProxy(t, core, func(o *Options) {
		o.Bridge = b
		o.PollBuffers = budget
	})
	u, _ := url.Parse(front)

	// A client that asks and reads only the status line: its answer, more than the
	// sockets between them hold, stays in the proxy's memory.
	held, err := net.Dial("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	if _, err := io.WriteString(held, "GET /file/held HTTP/1.1\r\nHost: x\r\napikey: slow\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReaderSize(held, 64).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "HTTP/1.1 200") {
		t.Fatalf("slow client's status line = %q, %v; want 200", line, err)
	}

	c := newClient(t)
	want := paddedResult("big", size)
	for i := 1; i <= 2; i++ {
		resp, got := do(t, c, http.MethodGet, front+"/file/big", nil)
		if resp.StatusCode != http.StatusOK || !bytes.Equal([]byte(got), want) || resp.ContentLength != int64(len(want)) {
			t.Fatalf("poll #%d of a result the budget cannot hold = %d, %d bytes (Content-Length %d), want 200 with Core's %d bytes",
				i, resp.StatusCode, len(got), resp.ContentLength, len(want))
		}
		if n := core.polls("big"); n != i {
			t.Errorf("after poll #%d Core was asked %d times, want %d: an answer sent as it came is not stored", i, n, i)
		}
	}

	// The slow client leaves: its answer's bytes go back to the budget, and the next
	// answer is buffered and stored.
	held.Close()
	for deadline := time.Now().Add(longWait); budget.Held() != 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d bytes of the budget still held %v after the slow client left: they were not given back", budget.Held(), longWait)
		}
	}
	before := core.polls("big")
	resp, got := do(t, c, http.MethodGet, front+"/file/big", nil)
	if resp.StatusCode != http.StatusOK || got != string(want) {
		t.Fatalf("poll after the slow client left = %d, %d bytes; want 200 with Core's %d bytes", resp.StatusCode, len(got), len(want))
	}
	if core.polls("big") != before+1 {
		t.Fatalf("Core asked %d times for the poll after the budget was free, want once", core.polls("big")-before)
	}
	resp, got = do(t, c, http.MethodGet, front+"/file/big", nil)
	if resp.StatusCode != http.StatusOK || got != string(want) || core.polls("big") != before+1 {
		t.Fatalf("next poll = %d, %d bytes, Core asked %d times more; want 200 with Core's %d bytes from the store",
			resp.StatusCode, len(got), core.polls("big")-before, len(want))
	}
	checkMetric(t, reg, "mdproxy_bridge_polls_total", map[string]string{"source": "store"}, 1)
}

// TestPollBufferStreamedShared: polls sharing one question to Core whose answer the
// budget cannot hold each get Core's whole answer: the one that asked as it comes, the
// others by asking Core again.
func TestPollBufferStreamedShared(t *testing.T) {
	const size = 2 << 20
	core := &bigResultCore{size: size, asked: map[string]int{}, release: make(chan struct{})}
	front, _ := newTestProxy(t, core, func(o *Options) {
		o.Bridge = newTestBridge(t)
		o.PollBufferBytes = 1 << 20
	})
	c := newClient(t)
	want := string(paddedResult("abc", size))
	const n = 3
	wait := pollsAtOnce(t, c, front+"/file/abc", n)
	deadline := time.Now().Add(10 * time.Second)
	for core.polls("abc") == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	waitJoined(t, n-1) // the other two wait on the first's question
	close(core.release)
	codes, got := wait()
	for i := range n {
		if codes[i] != http.StatusOK || got[i] != want {
			t.Errorf("poll %d = %d, %d bytes; want 200 with Core's %d bytes", i, codes[i], len(got[i]), len(want))
		}
	}
	if asked := core.polls("abc"); asked < 2 || asked > n {
		t.Errorf("Core asked %d times for %d concurrent polls of an answer over the budget, want 2 to %d", asked, n, n)
	}
}

// TestPollBufferStreamedCut: an answer sent as it came that Core breaks off is cut at
// the client too (never a whole-looking 200), and counted as Core's reset.
func TestPollBufferStreamedCut(t *testing.T) {
	up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(4<<20))
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(paddedResult("cut", 2<<20))
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler)
	})
	front, reg := newTestProxy(t, up, func(o *Options) {
		o.Bridge = newTestBridge(t)
		o.PollBufferBytes = 64 << 10
	})
	resp, err := newClient(t).Get(front + "/file/cut")
	if err != nil {
		t.Fatalf("GET /file/cut: %v, want the header of Core's answer", err)
	}
	n, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err == nil {
		t.Errorf("read %d bytes of a 4 MiB answer Core broke off at 2 MiB with no error, want the connection cut", n)
	}
	waitMetric(t, reg, "mdproxy_upstream_errors_total", map[string]string{"route": "file_result", "kind": "reset"}, 1)
}

// TestBridgedPollSpellings: only GET /file/{data_id} spelt as Core's API writes it is
// answered by the bridge. Other spellings that route to file_result (a trailing slash,
// the route in upper case, a doubled slash, a percent-escape) go to Core as they are,
// under the limit, and Core's 404 to them (Core on Linux) neither reaches the client as
// a pending answer nor makes the bridge forget the id: its poll still gets the pending
// answer, and its callback is still awaited.
func TestBridgedPollSpellings(t *testing.T) {
	const id = "0a1b2c3d4e5f60718293a4b5c6d7e8f9"
	up := &recordingUpstream{}
	core := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		up.ServeHTTP(httptest.NewRecorder(), r) // records the target only
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		_, _ = io.WriteString(w, `{"err":"Not found"}`)
	})
	b := newTestBridge(t)
	_, secret, err := b.Callback()
	if err != nil {
		t.Fatal(err)
	}
	b.Submitted(id, secret, bridge.OwnerOf(""))
	front, _ := newTestProxy(t, core, func(o *Options) { o.Bridge = b })
	for _, target := range []string{"/file/" + id + "/", "/FILE/" + id, "/File/" + id, "//file/" + id, "/file/%30" + id[1:]} {
		resp, body := rawRequest(t, front, "GET "+target+" HTTP/1.1\r\n")
		if resp.StatusCode != http.StatusNotFound || body != `{"err":"Not found"}` {
			t.Errorf("GET %s = %d %q, want Core's 404 (not the pending answer)", target, resp.StatusCode, body)
		}
		if reqs := up.requests(); len(reqs) == 0 || !strings.HasSuffix(reqs[len(reqs)-1], target) {
			t.Errorf("GET %s: Core's requests %q, want the last one for %s as spelt", target, reqs, target)
		}
	}
	before := up.count()
	resp, body := do(t, newClient(t), http.MethodGet, front+"/file/"+id, nil)
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, `"scan_all_result_i":255`) || up.count() != before {
		t.Errorf("GET /file/%s after the other spellings = %d %q (Core asked %d more times), want the pending answer without Core", id, resp.StatusCode, body, up.count()-before)
	}
	if n := b.PendingLen(); n != 1 {
		t.Errorf("pending ids = %d, want 1: a 404 to another spelling is not Core losing the scan", n)
	}
}

// TestBridgePollOtherDataID: a final answer of Core to GET /file/{id} that names another
// data_id is relayed as Core's answer but neither stored nor taken as the id's result:
// the next poll asks Core again, and the id's own callback is still believed.
func TestBridgePollOtherDataID(t *testing.T) {
	const id = "11111111111111111111111111111111"
	var mu sync.Mutex
	asked := 0
	up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		asked++
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(paddedResult("someone-elses-id", 300))
	})
	b, cb, _, clock := overdueBridge(t, id)
	front, _ := newTestProxy(t, up, func(o *Options) { o.Bridge = b })
	c := newClient(t)
	for i := 1; i <= 2; i++ {
		clock.Advance(5 * time.Millisecond)
		resp, body := do(t, c, http.MethodGet, front+"/file/"+id, nil)
		if resp.StatusCode != http.StatusOK || !strings.Contains(body, "someone-elses-id") {
			t.Errorf("poll #%d = %d %.80q, want Core's answer relayed", i, resp.StatusCode, body)
		}
		mu.Lock()
		n := asked
		mu.Unlock()
		if n != i {
			t.Errorf("after poll #%d Core was asked %d times, want %d: an answer for another id is not stored", i, n, i)
		}
	}
	// The id's own callback is believed, and its result then answers the polls.
	cbu, _ := url.Parse(cb)
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodPost, cbu.Path, bytes.NewReader(paddedResult(id, 300)))
	req.Header.Set("Content-Type", "application/json")
	b.Handler().ServeHTTP(rec, req)
	if rec.Code != http.StatusOK {
		t.Fatalf("the id's callback = %d %s, want 200", rec.Code, rec.Body.String())
	}
	resp, body := do(t, c, http.MethodGet, front+"/file/"+id, nil)
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, `"data_id":"`+id+`"`) {
		t.Errorf("poll after the callback = %d %.80q, want the id's own result", resp.StatusCode, body)
	}
}

// TestBridgedPollTrailersNotHeaders: Core's trailer fields of a poll's answer, which the
// bridge reads whole and sends with its length, do not become header fields (RFC 9110,
// section 6.5.1): the client gets the body and Core's header, no trailer.
func TestBridgedPollTrailersNotHeaders(t *testing.T) {
	up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Trailer", "X-Checksum")
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Core", "yes")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(paddedResult("abc", 300))
		w.Header().Set("X-Checksum", "trailer")
	})
	front, _ := newTestProxy(t, up, func(o *Options) { o.Bridge = newTestBridge(t) })
	resp, body := do(t, newClient(t), http.MethodGet, front+"/file/abc", nil)
	if resp.StatusCode != http.StatusOK || body != string(paddedResult("abc", 300)) || resp.Header.Get("X-Core") != "yes" {
		t.Fatalf("poll = %d %.60q (X-Core %q), want Core's 200, body and header", resp.StatusCode, body, resp.Header.Get("X-Core"))
	}
	if v := resp.Header.Values("X-Checksum"); v != nil {
		t.Errorf("Core's trailer X-Checksum reached the client as a header field: %q", v)
	}
	if v := resp.Trailer.Get("X-Checksum"); v != "" {
		t.Errorf("Core's trailer X-Checksum reached the client as a trailer %q of an answer sent whole", v)
	}
}

// TestWebhookStatusNoTrailerAnnounced: the webhook status, redacted and sent whole with
// its length, announces no trailer (Core's Trailer field named some that never come).
func TestWebhookStatusNoTrailerAnnounced(t *testing.T) {
	up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Trailer", "X-T")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, `{"url":"http://client.example/hook","status_code":200}`)
		w.Header().Set("X-T", "1")
	})
	front, _ := newTestProxy(t, up, func(o *Options) { o.Bridge = newTestBridge(t) })
	resp, body := do(t, newClient(t), http.MethodGet, front+"/file/webhook/abc", nil)
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, "client.example") {
		t.Fatalf("webhook status = %d %q, want Core's 200", resp.StatusCode, body)
	}
	if v := resp.Header.Values("Trailer"); v != nil || len(resp.Trailer) != 0 {
		t.Errorf("webhook status announces trailers %q (trailer %v), want none: it is sent whole", v, resp.Trailer)
	}
}

// TestBridgedSubmissionAnswerCut: Core's 200 to a bridged submission that breaks off
// before the proxy read its data_id gets 502 saying Core accepted the file, never
// "Core could not be reached", which would have the client submit it again.
func TestBridgedSubmissionAnswerCut(t *testing.T) {
	up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Length", "40")
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, `{"data_id":"ab`)
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler)
	})
	front, _ := newTestProxy(t, up, func(o *Options) { o.Bridge = newTestBridge(t) })
	req, _ := http.NewRequest(http.MethodPost, front+"/file", strings.NewReader("file"))
	resp, err := newClient(t).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadGateway || !strings.Contains(string(body), "accepted the file") {
		t.Errorf("submission whose 200 broke off = %d %s, want 502 saying Core accepted the file", resp.StatusCode, body)
	}
}
