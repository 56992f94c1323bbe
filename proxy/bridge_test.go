package proxy

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

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
	var wg sync.WaitGroup
	bodies := make([]string, n)
	codes := make([]int, n)
	for i := range n {
		wg.Go(func() {
			resp, err := c.Get(front + "/file/abc")
			if err != nil {
				t.Errorf("poll %d: %v", i, err)
				return
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			bodies[i], codes[i] = string(b), resp.StatusCode
		})
	}
	time.Sleep(100 * time.Millisecond) // the eight wait on the first's request
	cancel()
	<-first
	// The first left: one of the eight asks again, and the others share that request.
	for requests.Load() < 2 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	close(release)
	wg.Wait()
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

// TestSecretsPattern: the bridge's callback secrets are found as written and with
// JSON's escaped slashes, and nothing else is touched.
func TestSecretsPattern(t *testing.T) {
	re := secretsPattern("http://127.0.0.1:9010/callback/")
	for _, tt := range []struct{ in, want string }{
		{`{"url":"http://127.0.0.1:9010/callback/0123abcd"}`, `{"url":"http://127.0.0.1:9010/callback/redacted"}`},
		{`{"url":"http:\/\/127.0.0.1:9010\/callback\/0123abcd"}`, `{"url":"http:\/\/127.0.0.1:9010\/callback\/redacted"}`},
		{`{"url":"http://client.example/callback/0123abcd"}`, `{"url":"http://client.example/callback/0123abcd"}`},
		{`{"url":"http://127.0.0.1:90100/callback/0123abcd"}`, `{"url":"http://127.0.0.1:90100/callback/0123abcd"}`},
	} {
		if got := string(re.ReplaceAll([]byte(tt.in), []byte("${1}redacted"))); got != tt.want {
			t.Errorf("redacting %s = %s, want %s", tt.in, got, tt.want)
		}
	}
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
	store, err := bridge.NewMemoryStore(64<<20, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(store.Close)
	clock := newFakeClock()
	b, err := bridge.New(bridge.Options{CallbackURL: "http://127.0.0.1:9", Store: store, Refresh: time.Millisecond, Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	_, secret, err := b.Callback()
	if err != nil {
		t.Fatal(err)
	}
	b.Submitted("pend", secret, bridge.OwnerOf(""))
	clock.Advance(5 * time.Millisecond) // past Refresh: overdue
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
