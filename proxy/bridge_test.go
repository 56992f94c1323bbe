package proxy

import (
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/mdproxy/mdproxy/bridge"
	"github.com/mdproxy/mdproxy/limiter"
)

// newTestBridge returns a bridge on a fresh store, for the proxy's options.
func newTestBridge(t *testing.T) *bridge.Bridge {
	t.Helper()
	b, _ := newTestBridgeStore(t)
	return b
}

// newTestBridgeStore returns a bridge on a fresh store of 64 MiB, and the store.
func newTestBridgeStore(t *testing.T) (*bridge.Bridge, *bridge.MemoryStore) {
	t.Helper()
	return newTestBridgeStoreOf(t, 64<<20)
}

// newTestBridgeStoreOf returns a bridge on a fresh store of maxBytes (it keeps results
// of up to maxBytes/16), and the store.
func newTestBridgeStoreOf(t *testing.T, maxBytes int64) (*bridge.Bridge, *bridge.MemoryStore) {
	t.Helper()
	store, err := bridge.NewMemoryStore(maxBytes, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(store.Close)
	b, err := bridge.New(bridge.Options{CallbackURL: "http://127.0.0.1:9", Store: store})
	if err != nil {
		t.Fatal(err)
	}
	return b, store
}

// TestBridgePollsShareOneCoreRequest: concurrent polls of an id the bridge does not know
// reach Core once, and every one of them gets Core's answer; the client that asked
// leaving does not take the answer away from the others.
func TestBridgePollsShareOneCoreRequest(t *testing.T) {
	var requests atomic.Int64
	release := make(chan struct{})
	upstream := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		_, _ = io.WriteString(w, `{"data_id":"abc","process_info":{"progress_percentage":40}}`)
	})
	front, reg := newTestProxy(t, upstream, func(o *Options) { o.Bridge = newTestBridge(t) })
	c := newClient(t)

	// The first poll asks Core, then leaves before Core answers.
	ctx, cancel := context.WithCancel(context.Background())
	first := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, front+"/file/abc", nil)
		resp, err := c.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		first <- err
	}()
	deadline := time.Now().Add(10 * time.Second)
	for requests.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}

	const n = 8
	wait := pollsAtOnce(t, c, front+"/file/abc", n)
	waitJoined(t, n) // the eight wait on the first's request
	cancel()
	<-first
	// The first left: one of the eight asks again, and the others share that request.
	for requests.Load() < 2 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	waitJoined(t, n-1)
	close(release)
	codes, bodies := wait()
	if got := requests.Load(); got != 2 {
		t.Errorf("requests reaching Core for 9 concurrent polls of one id, the first leaving = %d, want 2", got)
	}
	for i := range n {
		if codes[i] != http.StatusOK || bodies[i] != `{"data_id":"abc","process_info":{"progress_percentage":40}}` {
			t.Errorf("poll %d = %d %q, want Core's answer", i, codes[i], bodies[i])
		}
	}
	// Every poll counts its decision, those sharing another's request included: the
	// first's and the eight's, all allowed (the route has no limit here).
	allowed := metricValue(t, reg, "mdproxy_limiter_decisions_total", map[string]string{"route": "file_result", "decision": "allowed"})
	if allowed != n+1 {
		t.Errorf("decisions{allowed} = %v for %d polls, want %d (one a poll)", allowed, n+1, n+1)
	}
}

// TestSecretsPattern: the bridge's callback secrets are found however Core spells their
// URL (scheme and host in another case or name, slashes escaped by JSON or percent-
// encoded, a base path), and nothing else is touched.
func TestSecretsPattern(t *testing.T) {
	const secret = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	for _, tt := range []struct{ path, in, want string }{
		{"/callback/", `{"url":"http://127.0.0.1:9010/callback/` + secret + `"}`, `{"url":"http://127.0.0.1:9010/callback/redacted"}`},
		{"/callback/", `{"url":"http:\/\/127.0.0.1:9010\/callback\/` + secret + `"}`, `{"url":"http:\/\/127.0.0.1:9010\/callback\/redacted"}`},
		{"/callback/", `{"url":"http:\u002f\u002f127.0.0.1:9010\u002fcallback\u002F` + secret + `"}`, `{"url":"http:\u002f\u002f127.0.0.1:9010\u002fcallback\u002Fredacted"}`},
		{"/callback/", `{"url":"HTTP://LOCALHOST:9010/CALLBACK/` + strings.ToUpper(secret) + `"}`, `{"url":"HTTP://LOCALHOST:9010/CALLBACK/redacted"}`},
		{"/callback/", `{"url":"http://127.0.0.1:9010%2Fcallback%2f` + secret + `"}`, `{"url":"http://127.0.0.1:9010%2Fcallback%2fredacted"}`},
		{"/hooks/callback/", `{"url":"https://mdproxy.internal/hooks/callback/` + secret + `"}`, `{"url":"https://mdproxy.internal/hooks/callback/redacted"}`},
		// Not the bridge's: another path, a token that is no secret, a data_id.
		{"/hooks/callback/", `{"url":"https://mdproxy.internal/callback/` + secret + `"}`, `{"url":"https://mdproxy.internal/callback/` + secret + `"}`},
		{"/callback/", `{"url":"http://client.example/callback/0123abcd"}`, `{"url":"http://client.example/callback/0123abcd"}`},
		{"/callback/", `{"data_id":"` + secret[:32] + `","url":"http://client.example/hook"}`, `{"data_id":"` + secret[:32] + `","url":"http://client.example/hook"}`},
	} {
		re := secretsPattern(tt.path)
		if got := string(re.ReplaceAll([]byte(tt.in), []byte("${1}redacted"))); got != tt.want {
			t.Errorf("redacting %s (path %s) = %s, want %s", tt.in, tt.path, got, tt.want)
		}
	}
}

// overdueBridge returns a bridge (Refresh 1 ms, on a fake clock) with id submitted by
// the clients without an apikey and overdue, so that its next poll asks Core; with its
// callback URL and secret, and the clock.
func overdueBridge(t *testing.T, id string) (b *bridge.Bridge, callbackURL, secret string, clock *clockwork.FakeClock) {
	t.Helper()
	store, err := bridge.NewMemoryStore(64<<20, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(store.Close)
	clock = newFakeClock()
	b, err = bridge.New(bridge.Options{CallbackURL: "http://127.0.0.1:9", Store: store, Refresh: time.Millisecond, Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	if callbackURL, secret, err = b.Callback(); err != nil {
		t.Fatal(err)
	}
	b.Submitted(id, secret, bridge.OwnerOf(""))
	clock.Advance(5 * time.Millisecond) // past Refresh: overdue
	return b, callbackURL, secret, clock
}

// TestBridgeOverdueCoreError: when Core answers a question about an overdue pending id
// with an error (its own limit's 503 here), the client that submitted the file gets the
// pending answer, never the error, and the id stays overdue for the next poll.
func TestBridgeOverdueCoreError(t *testing.T) {
	var polls atomic.Int64
	upstream := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		polls.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = io.WriteString(w, `{"err":"Server is too busy. Try again later."}`)
	})
	b, _, _, _ := overdueBridge(t, "pend")
	front, _ := newTestProxy(t, upstream, func(o *Options) { o.Bridge = b })
	c := newClient(t)
	for i := range 2 {
		resp, body := do(t, c, http.MethodGet, front+"/file/pend", nil)
		if resp.StatusCode != http.StatusOK || !strings.Contains(body, `"scan_all_result_i":255`) {
			t.Errorf("poll #%d of an overdue id Core answers 503 = %d %s, want 200 in progress", i, resp.StatusCode, body)
		}
	}
	if got := polls.Load(); got != 2 {
		t.Errorf("questions to Core = %d, want 2 (the id stays overdue after Core's error)", got)
	}
}

// TestOwnAnswersDated: the answers the proxy gives itself without Core, a limit answer
// and a store hit, carry one Date header of the time they were given (RFC 9110, section
// 6.6.1), which the proxy sets from the request's start rather than net/http from a
// clock read of its own.
func TestOwnAnswersDated(t *testing.T) {
	const id = "61dffeaa728844adbf49eb090e4ece0e"
	br, store := newTestBridgeStore(t)
	store.Put(id, bridge.Result{Body: []byte(`{"data_id":"` + id + `"}`), ContentType: "application/json", Owner: bridge.OwnerOf("k")})
	set := limitSet(t, map[string]limiter.Limit{"batch_status": {Rate: 0.001, Burst: 1}}, nil)
	base, _ := newTestProxy(t, &countingUpstream{}, func(o *Options) {
		o.Limits = set
		o.Bridge = br
	})
	if resp, _ := do(t, nil, http.MethodGet, base+"/file/batch/b1", nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("first request: status = %d, want 200", resp.StatusCode)
	}
	for _, tc := range []struct {
		name, path string
		want       int
	}{
		{"limit answer", "/file/batch/b1", http.StatusServiceUnavailable},
		{"store hit", "/file/" + id, http.StatusOK},
	} {
		// Several answers, so that some share a memoized value and, over a second
		// boundary, some do not.
		for i := range 6 {
			before := time.Now().Truncate(time.Second)
			resp, _ := do(t, nil, http.MethodGet, base+tc.path, http.Header{"Apikey": {"k"}})
			after := time.Now()
			if resp.StatusCode != tc.want {
				t.Fatalf("%s: status = %d, want %d", tc.name, resp.StatusCode, tc.want)
			}
			dates := resp.Header.Values("Date")
			if len(dates) != 1 {
				t.Fatalf("%s: Date headers %q, want one", tc.name, dates)
			}
			d, err := http.ParseTime(dates[0])
			if err != nil || !strings.HasSuffix(dates[0], " GMT") {
				t.Fatalf("%s: Date %q is not an IMF-fixdate: %v", tc.name, dates[0], err)
			}
			if d.Before(before) || d.After(after) {
				t.Errorf("%s: Date %v, want between %v and %v", tc.name, d, before, after)
			}
			if i == 2 {
				time.Sleep(time.Until(after.Truncate(time.Second).Add(time.Second)))
			}
		}
	}
}

// wholeAnswerUpstream is a Core that honours what askWholeAnswer takes away: it answers
// polls with http.ServeContent (Range, If-None-Match, If-Modified-Since) and gzips any
// answer when Accept-Encoding allows gzip. It records, per request, the header fields
// that decide those, and answers the webhook status with the last callbackurl a
// submission brought (holding the bridge's secret).
type wholeAnswerUpstream struct {
	mu       sync.Mutex
	seen     []http.Header
	callback string
	release  chan struct{} // closed to let polls answer; nil: at once
}

func (u *wholeAnswerUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	u.mu.Lock()
	u.seen = append(u.seen, r.Header.Clone())
	if cb := r.Header.Get("callbackurl"); cb != "" {
		u.callback = cb
	}
	cb := u.callback
	u.mu.Unlock()
	var body []byte
	switch {
	case r.Method == http.MethodPost && r.URL.Path == "/file":
		_, _ = io.Copy(io.Discard, r.Body)
		body = []byte(`{"data_id":"abc"}`)
	case strings.HasPrefix(r.URL.Path, "/file/webhook/"):
		body = []byte(`{"url":"` + cb + `","status":"pending"}`)
	default:
		if u.release != nil {
			<-u.release
		}
		body = []byte(`{"data_id":"abc","scan_results":{"scan_all_result_i":0,"progress_percentage":40},"process_info":{"progress_percentage":40}}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("ETag", `"v1"`)
	if strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
		var zb bytes.Buffer
		zw := gzip.NewWriter(&zb)
		_, _ = zw.Write(body)
		_ = zw.Close()
		body = zb.Bytes()
		w.Header().Set("Content-Encoding", "gzip")
	}
	http.ServeContent(w, r, "", time.Unix(1e9, 0), bytes.NewReader(body))
}

// TestBridgeAsksWholeAnswer: with the bridge on, a poll, a submission and the webhook
// status reach Core without Range, preconditions or an encoding the proxy cannot read
// (Accept-Encoding: identity), whatever the client sent; so that the webhook status is
// redacted, and a poll's answer shared with others is one any of them may take.
func TestBridgeAsksWholeAnswer(t *testing.T) {
	up := &wholeAnswerUpstream{}
	b := newTestBridge(t)
	front, _ := newTestProxy(t, up, func(o *Options) { o.Bridge = b })
	c := newClient(t)
	asking := http.Header{
		"Range":             {"bytes=0-9"},
		"If-None-Match":     {`"v1"`},
		"If-Modified-Since": {time.Unix(2e9, 0).UTC().Format(http.TimeFormat)},
		"Accept-Encoding":   {"gzip"},
	}
	do := func(method, path string, body string, h http.Header) (*http.Response, string) {
		t.Helper()
		req, _ := http.NewRequest(method, front+path, strings.NewReader(body))
		for k, v := range h {
			req.Header[k] = v
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		defer resp.Body.Close()
		got, _ := io.ReadAll(resp.Body)
		return resp, string(got)
	}

	// A submission whose client names callbackurl in Connection still carries the
	// bridge's callback URL to Core.
	sub := asking.Clone()
	sub["Connection"] = []string{"callbackurl"}
	if resp, got := do(http.MethodPost, "/file", "hello", sub); resp.StatusCode != http.StatusOK || got != `{"data_id":"abc"}` {
		t.Fatalf("POST /file = %d %q (Content-Encoding %q), want 200 with Core's plain answer", resp.StatusCode, got, resp.Header.Get("Content-Encoding"))
	}
	// The webhook status: whole, plain, and redacted.
	resp, got := do(http.MethodGet, "/file/webhook/abc", "", asking)
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Encoding") != "" || !strings.Contains(got, b.CallbackPrefix()+"redacted") {
		t.Errorf("GET /file/webhook/abc = %d %q (Content-Encoding %q), want 200 with the secret redacted", resp.StatusCode, got, resp.Header.Get("Content-Encoding"))
	}
	// A poll the bridge does not know (another owner's id): asked of Core, whole.
	resp, got = do(http.MethodGet, "/file/zzz", "", asking)
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Encoding") != "" || !strings.HasPrefix(got, `{"data_id":"abc"`) {
		t.Errorf("GET /file/zzz = %d %q (Content-Encoding %q), want 200 with Core's whole plain answer", resp.StatusCode, got, resp.Header.Get("Content-Encoding"))
	}

	up.mu.Lock()
	defer up.mu.Unlock()
	if len(up.seen) != 3 {
		t.Fatalf("Core got %d requests, want 3", len(up.seen))
	}
	if cb := up.seen[0].Get("callbackurl"); !strings.HasPrefix(cb, b.CallbackPrefix()) {
		t.Errorf("submission reached Core with callbackurl %q, want the bridge's (%s...)", cb, b.CallbackPrefix())
	}
	for i, h := range up.seen {
		if ae := h.Values("Accept-Encoding"); len(ae) != 1 || ae[0] != "identity" {
			t.Errorf("request %d reached Core with Accept-Encoding %q, want identity", i, ae)
		}
		for _, k := range []string{"Range", "If-None-Match", "If-Modified-Since"} {
			if v := h.Get(k); v != "" {
				t.Errorf("request %d reached Core with %s %q, want none", i, k, v)
			}
		}
	}
}

// TestBridgeSharedPollPerClient: a poll that asked for a range, a gzip answer or a
// validation shares Core's answer with a plain poll of the same id and owner, and each
// gets the whole plain answer: never a 206, a 304 or a gzip body it did not ask for.
func TestBridgeSharedPollPerClient(t *testing.T) {
	for _, first := range []http.Header{
		{"Range": {"bytes=0-9"}},
		{"If-None-Match": {`"v1"`}},
		{"Accept-Encoding": {"gzip"}},
	} {
		t.Run(strings.Join(slices.Collect(maps.Keys(first)), ""), func(t *testing.T) {
			up := &wholeAnswerUpstream{release: make(chan struct{})}
			front, _ := newTestProxy(t, up, func(o *Options) { o.Bridge = newTestBridge(t) })
			c := newClient(t)
			type answer struct {
				status int
				ce     string
				body   string
				err    error
			}
			poll := func(h http.Header) chan answer {
				ch := make(chan answer, 1)
				go func() {
					req, _ := http.NewRequest(http.MethodGet, front+"/file/zzz", nil)
					for k, v := range h {
						req.Header[k] = v
					}
					resp, err := c.Do(req)
					if err != nil {
						ch <- answer{err: err}
						return
					}
					defer resp.Body.Close()
					b, err := io.ReadAll(resp.Body)
					ch <- answer{resp.StatusCode, resp.Header.Get("Content-Encoding"), string(b), err}
				}()
				return ch
			}
			a := poll(first)
			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
				up.mu.Lock()
				n := len(up.seen)
				up.mu.Unlock()
				if n == 1 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("the first poll did not reach Core within 10 s")
				}
			}
			plain := poll(nil)
			waitJoined(t, 1) // the plain poll joins the first one's question
			close(up.release)
			for name, ch := range map[string]chan answer{"first": a, "plain": plain} {
				got := <-ch
				if got.err != nil || got.status != http.StatusOK || got.ce != "" || !strings.HasPrefix(got.body, `{"data_id":"abc"`) {
					t.Errorf("%s poll = %d (Content-Encoding %q) %q, %v; want 200 with Core's whole plain answer", name, got.status, got.ce, got.body, got.err)
				}
			}
		})
	}
}

// TestRelayedNoContentType: an answer of Core without a Content-Type reaches the client
// without one, forwarded or shared by the bridge, never with one net/http guessed from
// the body (a sanitized file that starts like HTML would be served as text/html).
func TestRelayedNoContentType(t *testing.T) {
	const html = `<html><script>alert(1)</script></html>`
	up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header()["Content-Type"] = nil // net/http would sniff one here too
		_, _ = io.WriteString(w, html)
	})
	for _, bridged := range []bool{false, true} {
		front, _ := newTestProxy(t, up, func(o *Options) {
			if bridged {
				o.Bridge = newTestBridge(t)
			}
		})
		for _, p := range []string{"/file/converted/abc", "/file/abc"} {
			resp, err := http.Get(front + p)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if ct, ok := resp.Header["Content-Type"]; ok || string(b) != html {
				t.Errorf("bridge %v, GET %s: Content-Type %q (present %v), body %q; want none and Core's body", bridged, p, ct, ok, b)
			}
		}
	}
}

// TestWebhookEncodedNotRelayed: a webhook status Core sends encoded or partial though
// the proxy asked for neither cannot be searched for the bridge's secrets: it is not
// relayed (502), rather than a secret.
func TestWebhookEncodedNotRelayed(t *testing.T) {
	for name, h := range map[string]http.Header{
		"gzip":    {"Content-Encoding": {"gzip"}},
		"partial": {"Content-Range": {"bytes 0-9/100"}},
	} {
		up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			maps.Copy(w.Header(), h)
			if name == "partial" {
				w.WriteHeader(http.StatusPartialContent)
			}
			_, _ = io.WriteString(w, "0123456789")
		})
		front, _ := newTestProxy(t, up, func(o *Options) { o.Bridge = newTestBridge(t) })
		resp, err := http.Get(front + "/file/webhook/abc")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadGateway || strings.Contains(string(b), "0123456789") {
			t.Errorf("%s webhook status: %d %q, want 502 without Core's bytes", name, resp.StatusCode, b)
		}
	}
}

// TestBridgedSubmissionLargeAnswerWhole: Core's answer to a bridged submission that is
// larger than the part the proxy reads for its data_id reaches the client whole.
func TestBridgedSubmissionLargeAnswerWhole(t *testing.T) {
	big := append([]byte(`{"data_id":"abc","pad":"`), bytes.Repeat([]byte("x"), 2*maxSubmitAnswer)...)
	big = append(big, `"}`...)
	up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(big)
	})
	front, _ := newTestProxy(t, up, func(o *Options) { o.Bridge = newTestBridge(t) })
	resp, err := newClient(t).Post(front+"/file", "application/octet-stream", strings.NewReader("hello"))
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK || !bytes.Equal(got, big) {
		t.Errorf("POST /file = %d, %d of %d bytes, %v; want 200 with Core's whole answer", resp.StatusCode, len(got), len(big), err)
	}
}

// TestBridgePollQueryNotShared: polls of one id and owner that differ in their query
// (a page of an archive's files) each get Core's answer to their own question, and a
// final answer to a query is not stored as the id's result.
func TestBridgePollQueryNotShared(t *testing.T) {
	release := make(chan struct{})
	var asked atomic.Int64
	up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked.Add(1)
		<-release
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"data_id":"abc","q":"`+r.URL.RawQuery+`","scan_results":{"scan_all_result_i":0,"progress_percentage":100},"process_info":{"progress_percentage":100,"result":"Allowed"}}`)
	})
	front, _ := newTestProxy(t, up, func(o *Options) { o.Bridge = newTestBridge(t) })
	var once sync.Once
	open := func() { once.Do(func() { close(release) }) }
	t.Cleanup(open) // before the upstream closes, which waits for its handlers
	c := newClient(t)
	get := func(q string) chan string {
		ch := make(chan string, 1)
		go func() {
			resp, err := c.Get(front + "/file/abc" + q)
			if err != nil {
				ch <- err.Error()
				return
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			ch <- string(b)
		}()
		return ch
	}
	first, second := get("?first=0&size=2"), get("?first=2&size=2")
	for deadline := time.Now().Add(10 * time.Second); asked.Load() < 2; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("Core was asked %d times for two polls with different queries, want 2", asked.Load())
		}
	}
	open()
	if got := <-first; !strings.Contains(got, `"q":"first=0&size=2"`) {
		t.Errorf("first poll got %q, want Core's answer to its own query", got)
	}
	if got := <-second; !strings.Contains(got, `"q":"first=2&size=2"`) {
		t.Errorf("second poll got %q, want Core's answer to its own query", got)
	}
	// Not stored: the plain poll asks Core again and gets the plain answer.
	if got := <-get(""); !strings.Contains(got, `"q":""`) || asked.Load() != 3 {
		t.Errorf("plain poll got %q with Core asked %d times, want Core's plain answer (asked 3 times)", got, asked.Load())
	}
}

// TestBridgedPollCoreBrokeOff: Core's answer to a bridged poll that breaks off, or an
// error answer larger than the proxy reads, reaches no client in part: each gets 502 in Core's
// error format (nothing was sent yet), counted 502 with Core's error, never 499 as if
// the client had left.
func TestBridgedPollCoreBrokeOff(t *testing.T) {
	up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/file/cut":
			w.Header().Set("Content-Length", "200")
			w.WriteHeader(http.StatusOK)
			_, _ = io.WriteString(w, `{"data_id":"cut","scan_results":{`)
			w.(http.Flusher).Flush()
			panic(http.ErrAbortHandler) // the connection ends 100-odd bytes short
		case "/file/big":
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusInternalServerError)
			_, _ = w.Write(bytes.Repeat([]byte(" "), maxPollError+1))
		}
	})
	front, reg := newTestProxy(t, up, func(o *Options) { o.Bridge = newTestBridge(t) })
	c := newClient(t)
	for _, tc := range []struct{ id, msg string }{{"cut", "broke off"}, {"big", "larger than the proxy reads"}} {
		resp, err := c.Get(front + "/file/" + tc.id)
		if err != nil {
			t.Fatalf("GET /file/%s: %v, want an answer", tc.id, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadGateway || !strings.Contains(string(body), tc.msg) || !strings.HasPrefix(string(body), `{"err":`) {
			t.Errorf("GET /file/%s = %d %q, want 502 with {\"err\": ...%s...}", tc.id, resp.StatusCode, body, tc.msg)
		}
	}
	waitMetric(t, reg, "mdproxy_requests_total", map[string]string{"route": "file_result", "code": "502"}, 2)
	if got := metricValue(t, reg, "mdproxy_requests_total", map[string]string{"route": "file_result", "code": "499"}); got != 0 {
		t.Errorf("requests_total{code=499} = %v, want 0: the clients did not leave", got)
	}
	waitMetric(t, reg, "mdproxy_upstream_errors_total", map[string]string{"route": "file_result", "kind": "reset"}, 1)
}

// TestBridgeSharedPollWaitsMaxWaitInAll: a poll that shared another's question to Core
// and asks again when that poll gives up waiting for its token has only what is left
// of its own MaxWait: before, it joined the queue with a whole new MaxWait and waited
// up to twice it in all. Here the route takes 10 polls a second, burst 1, MaxWait 2 s,
// on a fake clock that stands still: poll A waits for the first turn (0.1 s), poll B
// shares A's question, 18 more take the turns to 1.9 s; once B has waited 1 s of the
// real time the proxy counts MaxWait in, A leaves, and B, its token 1.9 s away with
// at most 1 s of its wait left, is refused at once (with a new MaxWait it would wait).
func TestBridgeSharedPollWaitsMaxWaitInAll(t *testing.T) {
	const maxWait = 2 * time.Second
	upstream := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, `{"data_id":"x","process_info":{"progress_percentage":40}}`)
	})
	clock := newFakeClock()
	front, _ := newTestProxy(t, upstream, func(o *Options) {
		o.Bridge = newTestBridge(t)
		o.Limits = limitSet(t, map[string]limiter.Limit{"file_result": {Rate: 10, Burst: 1, MaxWait: maxWait}}, clock)
	})
	c := keepAliveClient(t, 64)
	poll := func(ctx context.Context, id, apikey string) (int, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, front+"/file/"+id, nil)
		req.Header.Set("apikey", apikey)
		resp, err := c.Do(req)
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		_, err = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, err
	}
	var wg sync.WaitGroup
	t.Cleanup(wg.Wait)
	if code, err := poll(context.Background(), "first", "k"); code != http.StatusOK || err != nil {
		t.Fatalf("first poll = %d, %v; want 200 (the burst's token)", code, err)
	}
	actx, cancel := context.WithCancel(context.Background())
	defer cancel()
	wg.Go(func() { _, _ = poll(actx, "same", "owner") }) // A: turn at 0.1 s
	blockUntilWaiting(t, clock, 1)
	type answer struct {
		code int
		err  error
	}
	b := make(chan answer, 1)
	go func() {
		code, err := poll(context.Background(), "same", "owner") // B: shares A's question
		b <- answer{code, err}
	}()
	waitJoined(t, 1)
	for i := range 18 { // polls of ids and clients of their own: turns at 0.2 s to 1.9 s
		wg.Go(func() { _, _ = poll(context.Background(), fmt.Sprintf("q%d", i), fmt.Sprintf("k%d", i)) })
	}
	blockUntilWaiting(t, clock, 19)
	// B's wait is counted in real time from its arrival: at least 1 s once this returns,
	// more on a loaded machine, which only leaves B less of its MaxWait.
	time.Sleep(time.Second)
	cancel() // A leaves: its turn goes to the next in line, and B asks again
	select {
	case got := <-b:
		if got.err != nil || got.code != http.StatusServiceUnavailable {
			t.Errorf("poll B = %d, %v; want the limit answer at once: its token 1.9 s away, at most 1 s of its MaxWait (%v) left", got.code, got.err, maxWait)
		}
	case <-time.After(longWait):
		t.Errorf("poll B unanswered %v after A left; want the limit answer at once: its token 1.9 s away, at most 1 s of its MaxWait (%v) left", longWait, maxWait)
	}
	clock.Advance(maxWait) // the others' turns
}
