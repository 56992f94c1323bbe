package bridge

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// post sends a callback with body to the secret path and returns the status.
func post(t *testing.T, srv *httptest.Server, secret string, body []byte) int {
	t.Helper()
	return send(t, srv, http.MethodPost, CallbackPath+secret, bytes.NewReader(body))
}

// send makes one request to srv and returns the status; the answer must be Core's error
// format or the listener's {} of a stored callback.
func send(t *testing.T, srv *httptest.Server, method, path string, body io.Reader) int {
	t.Helper()
	req, err := http.NewRequest(method, srv.URL+path, body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading the answer: %v", method, path, err)
	}
	if resp.StatusCode != http.StatusOK && method != http.MethodHead && !bytes.HasPrefix(b, []byte(`{"err":`)) {
		t.Errorf("%s %s = %d %s, want Core's error format", method, path, resp.StatusCode, b)
	}
	return resp.StatusCode
}

// outcomes lists every callback outcome, the fixed set Callbacks reports.
var outcomes = []string{OutcomeStored, OutcomeForged, OutcomeInvalid, OutcomeBusy}

// counts returns b's callback counts, checking that the set of outcomes is the fixed one.
func counts(t *testing.T, b *Bridge) map[string]float64 {
	t.Helper()
	c := b.Callbacks()
	if len(c) != len(outcomes) {
		t.Fatalf("Callbacks() = %v, want exactly %v", c, outcomes)
	}
	for _, o := range outcomes {
		if _, ok := c[o]; !ok {
			t.Fatalf("Callbacks() = %v, want a count for %q", c, o)
		}
	}
	return c
}

// chunked hides a reader's length, so that the request is sent without Content-Length.
type chunked struct{ r io.Reader }

func (c chunked) Read(p []byte) (int, error) { return c.r.Read(p) }

func TestCallbackForged(t *testing.T) {
	const maxBody = 4 << 10
	tb := newTestBridge(t, Options{MaxCallbackBytes: maxBody})
	srv := httptest.NewServer(tb.Handler())
	defer srv.Close()
	const id = "victim"
	secret := tb.submit(t, id, alice)
	running := result(id, 30, 255)
	tb.Observe(id, alice, running, "application/json")
	oversized := append(finalResult(id)[:0:0], finalResult(id)...)
	oversized = append(oversized[:len(oversized)-1], []byte(`,"pad":"`+strings.Repeat("x", maxBody)+`"}`)...)
	wrong := strings.Repeat("0", 64)

	tests := []struct {
		name    string
		method  string
		path    string
		body    func() io.Reader
		status  int
		outcome string
	}{
		{"wrong secret", "POST", CallbackPath + wrong, bodyOf(finalResult(id)), 404, OutcomeForged},
		{"secret with one digit changed", "POST", CallbackPath + flipLast(secret), bodyOf(finalResult(id)), 404, OutcomeForged},
		{"secret prefix", "POST", CallbackPath + secret[:32], bodyOf(finalResult(id)), 404, OutcomeForged},
		{"secret in upper case", "POST", CallbackPath + strings.ToUpper(secret), bodyOf(finalResult(id)), 404, OutcomeForged},
		{"no secret", "POST", CallbackPath, bodyOf(finalResult(id)), 404, OutcomeForged},
		{"secret and more path", "POST", CallbackPath + secret + "/x", bodyOf(finalResult(id)), 404, OutcomeForged},
		{"outside /callback/", "POST", "/" + secret, bodyOf(finalResult(id)), 404, OutcomeForged},
		{"right secret, wrong data_id", "POST", CallbackPath + secret, bodyOf(infectedResult("other")), 400, OutcomeInvalid},
		{"right secret, no data_id", "POST", CallbackPath + secret, bodyOf([]byte(`{"scan_results":{"progress_percentage":100}}`)), 400, OutcomeInvalid},
		{"right secret, data_id of another case", "POST", CallbackPath + secret, bodyOf(finalResult(strings.ToUpper(id))), 400, OutcomeInvalid},
		{"right secret, not final", "POST", CallbackPath + secret, bodyOf(result(id, 99, 0)), 400, OutcomeInvalid},
		{"right secret, in progress at 100", "POST", CallbackPath + secret, bodyOf(result(id, 100, 255)), 400, OutcomeInvalid},
		{"right secret, invalid JSON", "POST", CallbackPath + secret, bodyOf([]byte(`{"data_id":"victim",`)), 400, OutcomeInvalid},
		{"right secret, not an object", "POST", CallbackPath + secret, bodyOf([]byte(`["victim"]`)), 400, OutcomeInvalid},
		{"right secret, empty body", "POST", CallbackPath + secret, bodyOf(nil), 400, OutcomeInvalid},
		{"right secret, oversized", "POST", CallbackPath + secret, bodyOf(oversized), 413, OutcomeInvalid},
		{"right secret, oversized without length", "POST", CallbackPath + secret, func() io.Reader { return chunked{bytes.NewReader(oversized)} }, 413, OutcomeInvalid},
		{"GET", "GET", CallbackPath + secret, bodyOf(nil), 405, OutcomeInvalid},
		{"PUT", "PUT", CallbackPath + secret, bodyOf(finalResult(id)), 405, OutcomeInvalid},
		{"HEAD", "HEAD", CallbackPath + secret, bodyOf(nil), 405, OutcomeInvalid},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := counts(t, tb.Bridge)
			if got := send(t, srv, tc.method, tc.path, tc.body()); got != tc.status {
				t.Errorf("%s %s = %d, want %d", tc.method, tc.path, got, tc.status)
			}
			after := counts(t, tb.Bridge)
			for _, o := range outcomes {
				want := before[o]
				if o == tc.outcome {
					want++
				}
				if after[o] != want {
					t.Errorf("Callbacks()[%s] = %v, want %v", o, after[o], want)
				}
			}
			// Nothing changed: the id is pending with Core's last reply, nothing stored.
			wantPoll(t, tb.Bridge, id, alice, Pending, running)
			if r, ok := tb.store.Get(id); ok {
				t.Errorf("store holds %s for %s after a refused callback", r.Body, id)
			}
			if n := tb.PendingLen(); n != 1 {
				t.Errorf("PendingLen() = %d, want 1", n)
			}
		})
	}

	// The right callback is still accepted after all of these.
	final := finalResult(id)
	if got := post(t, srv, secret, final); got != http.StatusOK {
		t.Fatalf("callback = %d, want 200", got)
	}
	wantPoll(t, tb.Bridge, id, alice, Stored, final)
	if r, _ := tb.store.Get(id); r.Owner != alice || r.ContentType != "application/json" {
		t.Errorf("stored owner %x, content type %q, want alice's and application/json", r.Owner[:4], r.ContentType)
	}
}

func bodyOf(b []byte) func() io.Reader { return func() io.Reader { return bytes.NewReader(b) } }

// flipLast changes the last hex digit of s.
func flipLast(s string) string {
	last := s[len(s)-1]
	repl := byte('0')
	if last == '0' {
		repl = '1'
	}
	return s[:len(s)-1] + string(repl)
}

func TestCallbackReplay(t *testing.T) {
	tb := newTestBridge(t, Options{})
	srv := httptest.NewServer(tb.Handler())
	defer srv.Close()
	secret := tb.submit(t, "r1", alice)
	clean := finalResult("r1")
	if got := post(t, srv, secret, clean); got != http.StatusOK {
		t.Fatalf("callback = %d, want 200", got)
	}
	before := counts(t, tb.Bridge)
	for _, body := range [][]byte{clean, infectedResult("r1")} {
		if got := post(t, srv, secret, body); got != http.StatusNotFound {
			t.Errorf("replayed callback = %d, want 404", got)
		}
	}
	after := counts(t, tb.Bridge)
	if after[OutcomeForged] != before[OutcomeForged]+2 || after[OutcomeStored] != before[OutcomeStored] {
		t.Errorf("Callbacks() = %v after two replays, want forged +2 from %v", after, before)
	}
	wantPoll(t, tb.Bridge, "r1", alice, Stored, clean)
	wantPoll(t, tb.Bridge, "r1", bob, Miss, nil)

	// A late callback for an id whose result a poll brought home changes nothing either.
	secret2 := tb.submit(t, "r2", alice)
	tb.Observe("r2", alice, clean2(), "application/json")
	if got := post(t, srv, secret2, infectedResult("r2")); got != http.StatusNotFound {
		t.Errorf("callback after a poll stored the result = %d, want 404", got)
	}
	wantPoll(t, tb.Bridge, "r2", alice, Stored, clean2())
}

func clean2() []byte { return finalResult("r2") }

// TestCallbackConcurrent delivers the same callback many times at once: exactly one is
// stored.
func TestCallbackConcurrent(t *testing.T) {
	tb := newTestBridge(t, Options{})
	srv := httptest.NewServer(tb.Handler())
	defer srv.Close()
	secret := tb.submit(t, "c1", alice)
	const n = 16
	codes := make(chan int, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			body := finalResult("c1")
			if i%2 == 1 {
				body = infectedResult("c1")
			}
			codes <- post(t, srv, secret, body)
		})
	}
	wg.Wait()
	close(codes)
	got := map[int]int{}
	for c := range codes {
		got[c]++
	}
	if got[http.StatusOK] != 1 || got[http.StatusNotFound] != n-1 {
		t.Errorf("statuses of %d concurrent deliveries = %v, want one 200 and %d 404", n, got, n-1)
	}
	if c := counts(t, tb.Bridge); c[OutcomeStored] != 1 || c[OutcomeForged] != n-1 {
		t.Errorf("Callbacks() = %v, want stored 1, forged %d", c, n-1)
	}
	if a := tb.Poll("c1", alice); a.Source != Stored {
		t.Errorf("Poll = %v, want store", a.Source)
	}
}

// TestSecondOwner checks that another apikey is never served a stored or pending answer,
// through the whole life of a submission.
func TestSecondOwner(t *testing.T) {
	tb := newTestBridge(t, Options{Refresh: time.Minute})
	srv := httptest.NewServer(tb.Handler())
	defer srv.Close()
	anonymous := OwnerOf("")
	others := []Owner{bob, anonymous, {}}
	secret := tb.submit(t, "s1", alice)
	check := func(stage string) {
		t.Helper()
		for _, o := range others {
			if a := tb.Poll("s1", o); a.Source != Miss || a.Body != nil {
				t.Errorf("%s: Poll by owner %x = %v %s, want miss", stage, o[:4], a.Source, a.Body)
			}
		}
	}
	check("pending")
	tb.Observe("s1", alice, result("s1", 50, 255), "application/json")
	check("pending with a reply")
	tb.clock.Add(time.Hour)
	check("overdue")
	if got := post(t, srv, secret, infectedResult("s1")); got != http.StatusOK {
		t.Fatalf("callback = %d, want 200", got)
	}
	check("stored")
	wantPoll(t, tb.Bridge, "s1", alice, Stored, infectedResult("s1"))
}

func TestCallbackLogsNoSecret(t *testing.T) {
	var logs bytes.Buffer
	tb := newTestBridge(t, Options{Logger: newDebugLogger(&logs)})
	srv := httptest.NewServer(tb.Handler())
	defer srv.Close()
	secret := tb.submit(t, "l1", alice)
	post(t, srv, flipLast(secret), finalResult("l1"))
	post(t, srv, secret, finalResult("l2"))
	if logs.Len() == 0 {
		t.Fatalf("no log line for refused callbacks")
	}
	for _, s := range []string{secret, flipLast(secret), secret[:16]} {
		if strings.Contains(logs.String(), s) {
			t.Errorf("logs hold a secret:\n%s", logs.String())
		}
	}
}

// BenchmarkPollStored measures Poll answering a stored result, the answer to most polls
// once callbacks flow.
func BenchmarkPollStored(b *testing.B) {
	tb := newTestBridge(b, Options{})
	ids := make([]string, 1024)
	for i := range ids {
		ids[i] = fmt.Sprintf("%032x", i)
		tb.Observe(ids[i], alice, finalResult(ids[i]), "application/json")
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			if a := tb.Poll(ids[i%len(ids)], alice); a.Source != Stored {
				b.Fatalf("Poll = %v, want store", a.Source)
			}
			i++
		}
	})
}

func newDebugLogger(w io.Writer) *slog.Logger {
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// TestCallbackEarly covers a callback that arrives before Core's answer to its
// submission was recorded.
func TestCallbackEarly(t *testing.T) {
	setup := func(t *testing.T, o Options) (testBridge, *httptest.Server) {
		tb := newTestBridge(t, o)
		srv := httptest.NewServer(tb.Handler())
		t.Cleanup(srv.Close)
		return tb, srv
	}
	issue := func(t *testing.T, tb testBridge) string {
		t.Helper()
		_, secret, err := tb.Callback()
		if err != nil {
			t.Fatal(err)
		}
		return secret
	}
	wantCounts := func(t *testing.T, b *Bridge, stored, forged, invalid float64) {
		t.Helper()
		c := counts(t, b)
		if c[OutcomeStored] != stored || c[OutcomeForged] != forged || c[OutcomeInvalid] != invalid {
			t.Errorf("Callbacks() = %v, want stored %v, forged %v, invalid %v", c, stored, forged, invalid)
		}
	}

	t.Run("held, then stored for the submitter", func(t *testing.T) {
		tb, srv := setup(t, Options{})
		secret := issue(t, tb)
		final := finalResult("e1")
		if got := post(t, srv, secret, final); got != http.StatusOK {
			t.Fatalf("early callback = %d, want 200", got)
		}
		wantPoll(t, tb.Bridge, "e1", alice, Miss, nil) // served to no one before Submitted
		wantCounts(t, tb.Bridge, 0, 0, 0)
		if got := post(t, srv, secret, infectedResult("e1")); got != http.StatusNotFound {
			t.Errorf("second early callback = %d, want 404", got)
		}
		wantCounts(t, tb.Bridge, 0, 1, 0)
		tb.Submitted("e1", secret, alice)
		wantPoll(t, tb.Bridge, "e1", alice, Stored, final)
		wantPoll(t, tb.Bridge, "e1", bob, Miss, nil)
		wantCounts(t, tb.Bridge, 1, 1, 0)
		if n := tb.PendingLen(); n != 0 {
			t.Errorf("PendingLen() = %d, want 0", n)
		}
		if got := post(t, srv, secret, final); got != http.StatusNotFound {
			t.Errorf("replay after storing = %d, want 404", got)
		}
	})
	t.Run("another data_id than Core's answer", func(t *testing.T) {
		tb, srv := setup(t, Options{})
		secret := issue(t, tb)
		if got := post(t, srv, secret, infectedResult("not-e2")); got != http.StatusOK {
			t.Fatalf("early callback = %d, want 200", got)
		}
		tb.Submitted("e2", secret, alice)
		wantPoll(t, tb.Bridge, "e2", alice, Pending, InProgress("e2"))
		wantPoll(t, tb.Bridge, "not-e2", alice, Miss, nil)
		wantCounts(t, tb.Bridge, 0, 0, 1)
		if r, ok := tb.store.Get("not-e2"); ok {
			t.Errorf("store holds %s for the early callback's data_id", r.Body)
		}
	})
	t.Run("refused early bodies leave the secret usable", func(t *testing.T) {
		tb, srv := setup(t, Options{})
		secret := issue(t, tb)
		for _, body := range [][]byte{result("e3", 50, 255), []byte(`{`), []byte(`{"scan_results":{"progress_percentage":100}}`)} {
			if got := post(t, srv, secret, body); got != http.StatusBadRequest {
				t.Errorf("early callback %s = %d, want 400", body, got)
			}
		}
		wantCounts(t, tb.Bridge, 0, 0, 3)
		if got := post(t, srv, secret, finalResult("e3")); got != http.StatusOK {
			t.Errorf("early callback = %d, want 200", got)
		}
		tb.Submitted("e3", secret, alice)
		wantPoll(t, tb.Bridge, "e3", alice, Stored, finalResult("e3"))
	})
	t.Run("held too long", func(t *testing.T) {
		tb, srv := setup(t, Options{})
		secret := issue(t, tb)
		quiet := issue(t, tb)
		if got := post(t, srv, secret, finalResult("e4")); got != http.StatusOK {
			t.Fatalf("early callback = %d, want 200", got)
		}
		tb.clock.Add(issuedTTL + time.Minute)
		tb.PendingLen() // sweeps
		wantCounts(t, tb.Bridge, 0, 1, 0)
		if got := post(t, srv, quiet, finalResult("e5")); got != http.StatusNotFound {
			t.Errorf("callback on a secret given out %v ago and never submitted = %d, want 404", issuedTTL+time.Minute, got)
		}
		// Submitted still works for a secret forgotten meanwhile (a long upload).
		tb.Submitted("e4", secret, alice)
		wantPoll(t, tb.Bridge, "e4", alice, Pending, InProgress("e4"))
		if got := post(t, srv, secret, finalResult("e4")); got != http.StatusOK {
			t.Errorf("callback after Submitted = %d, want 200", got)
		}
		wantPoll(t, tb.Bridge, "e4", alice, Stored, finalResult("e4"))
		if n := len(tb.issued); n != 0 {
			t.Errorf("%d secrets remembered, want none", n)
		}
		if !tb.bodies.TryAcquire(tb.maxBody) {
			t.Errorf("bytes of callback bodies still held once the early one was forgotten, want none")
		}
	})
	t.Run("early bodies count with those being read", func(t *testing.T) {
		const maxBody = 4 << 10
		tb, srv := setup(t, Options{MaxCallbackBytes: maxBody})
		big := func(id string) []byte {
			b := finalResult(id)
			return append(b[:len(b)-1], []byte(`,"pad":"`+strings.Repeat("x", 3<<10)+`"}`)...)
		}
		s1, s2 := issue(t, tb), issue(t, tb)
		if got := post(t, srv, s1, big("e6")); got != http.StatusOK {
			t.Fatalf("first early callback = %d, want 200", got)
		}
		if got := post(t, srv, s2, big("e7")); got != http.StatusServiceUnavailable {
			t.Errorf("early callback over the cap of bodies in memory = %d, want 503 (busy: Core delivers it again)", got)
		}
		tb.Submitted("e6", s1, alice)
		if got := post(t, srv, s2, big("e7")); got != http.StatusOK {
			t.Errorf("early callback once room was made = %d, want 200", got)
		}
	})
}

// BenchmarkPollPending measures Poll answering a pending id: a store miss, then the
// bridge's lock.
func BenchmarkPollPending(b *testing.B) {
	tb := newTestBridge(b, Options{})
	ids := make([]string, 1024)
	for i := range ids {
		ids[i] = fmt.Sprintf("%032x", i)
		tb.submit(b, ids[i], alice)
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			if a := tb.Poll(ids[i%len(ids)], alice); a.Source != Pending {
				b.Fatalf("Poll = %v, want pending", a.Source)
			}
			i++
		}
	})
}

// TestGone: a pending id that Core answered 404 for (it lost the scan) is forgotten:
// its next poll goes to Core instead of waiting a day for a callback.
func TestGone(t *testing.T) {
	b := newTestBridge(t, Options{})
	owner, other := OwnerOf("k"), OwnerOf("other")
	b.submit(t, "id1", owner)
	b.Gone("id1", other) // another owner's 404 changes nothing
	if got := b.Poll("id1", owner).Source; got != Pending {
		t.Fatalf("Poll after another owner's 404 = %v, want pending", got)
	}
	b.Gone("id1", owner)
	if got := b.Poll("id1", owner).Source; got != Miss {
		t.Errorf("Poll after Core's 404 = %v, want miss (asked of Core)", got)
	}
	if n := b.PendingLen(); n != 0 {
		t.Errorf("PendingLen() after Core's 404 = %d, want 0", n)
	}
}

// TestNotAsked: an overdue poll that did not reach Core (refused by the limit) leaves the
// id overdue, so that the next poll asks again instead of waiting Refresh.
func TestNotAsked(t *testing.T) {
	b := newTestBridge(t, Options{Refresh: time.Minute})
	owner := OwnerOf("k")
	b.submit(t, "id1", owner)
	b.clock.Add(2 * time.Minute) // no callback for Refresh: overdue
	if got := b.Poll("id1", owner).Source; got != Overdue {
		t.Fatalf("Poll of an id without callback for 2 min = %v, want overdue", got)
	}
	if got := b.Poll("id1", owner).Source; got != Pending {
		t.Fatalf("second Poll at once = %v, want pending (asked once per Refresh)", got)
	}
	b.NotAsked("id1", OwnerOf("other")) // another owner's changes nothing
	if got := b.Poll("id1", owner).Source; got != Pending {
		t.Fatalf("Poll after another owner's NotAsked = %v, want pending", got)
	}
	b.NotAsked("id1", owner)
	if got := b.Poll("id1", owner).Source; got != Overdue {
		t.Errorf("Poll after NotAsked = %v, want overdue again", got)
	}
}

// TestCallbacksLost: once Core answers an overdue question with a final result whose
// callback never came, the callback path looks broken and every poll of a pending id asks
// Core (within the route's limit), until a callback is stored again. A slow scan alone
// does not do it.
func TestCallbacksLost(t *testing.T) {
	tb := newTestBridge(t, Options{Refresh: time.Minute})
	srv := httptest.NewServer(tb.Handler())
	defer srv.Close()
	tb.submit(t, "x", alice)
	ys := tb.submit(t, "y", alice)
	tb.clock.Add(2 * time.Minute)
	if got := tb.Poll("x", alice).Source; got != Overdue {
		t.Fatalf("Poll(x) after 2 min without callback = %v, want overdue", got)
	}
	tb.Observe("x", alice, []byte(`{"data_id":"x","process_info":{"progress_percentage":50}}`), "application/json")
	if got := tb.Poll("y", alice).Source; got != Overdue {
		t.Fatalf("Poll(y) = %v, want overdue (its own first question)", got)
	}
	if got := tb.Poll("y", alice).Source; got != Pending {
		t.Fatalf("Poll(y) again after a scan still running = %v, want pending (silence is no evidence)", got)
	}
	tb.clock.Add(2 * time.Minute)
	if got := tb.Poll("x", alice).Source; got != Overdue {
		t.Fatalf("Poll(x) 2 min later = %v, want overdue", got)
	}
	tb.Observe("x", alice, finalResult("x"), "application/json") // final, no callback: lost
	for i := range 3 {
		if got := tb.Poll("y", alice).Source; got != Overdue {
			t.Fatalf("Poll(y) #%d with callbacks lost = %v, want overdue every time", i, got)
		}
	}
	if code := post(t, srv, ys, finalResult("y")); code != http.StatusOK {
		t.Fatalf("callback of y = %d, want 200", code)
	}
	tb.submit(t, "z", alice)
	if got := tb.Poll("z", alice).Source; got != Pending {
		t.Errorf("Poll(z) after a callback was stored again = %v, want pending", got)
	}
}

// TestCallbackURLWithPath: with a callback URL that has a path, the listener takes
// Core's callbacks at that path + /callback/{secret} (Core posts there), and at
// /callback/{secret} (a proxy in front took the path off); nowhere else.
func TestCallbackURLWithPath(t *testing.T) {
	tb := newTestBridge(t, Options{CallbackURL: "http://127.0.0.1:9010/mdp/"})
	srv := httptest.NewServer(tb.Handler())
	t.Cleanup(srv.Close)
	if got, want := tb.CallbackPrefix(), "http://127.0.0.1:9010/mdp/callback/"; got != want {
		t.Fatalf("CallbackPrefix() = %q, want %q", got, want)
	}
	for i, prefix := range []string{"/mdp/callback/", "/callback/"} {
		id := fmt.Sprintf("p%d", i)
		secret := tb.submit(t, id, alice)
		if code := send(t, srv, http.MethodPost, "/other/callback/"+secret, bytes.NewReader(finalResult(id))); code != http.StatusNotFound {
			t.Errorf("callback at /other/callback/: status %d, want 404", code)
		}
		if code := send(t, srv, http.MethodPost, prefix+secret, bytes.NewReader(finalResult(id))); code != http.StatusOK {
			t.Errorf("callback at %s: status %d, want 200", prefix, code)
		}
		wantPoll(t, tb.Bridge, id, alice, Stored, finalResult(id))
	}
}

// TestCallbackBodiesBounded: the callback bodies read at once weigh at most
// MaxCallbackBytes in all: while one callback's body is being read, another that would
// pass the bound is refused with 503 and Retry-After (Core delivers it again), counted
// busy, and stores nothing; once the first is read, the second is taken.
func TestCallbackBodiesBounded(t *testing.T) {
	tb := newTestBridge(t, Options{MaxCallbackBytes: 4096})
	// The handler reads a body only once it holds its weight: its first read of the
	// first callback's body says that the first holds its 3000 bytes.
	reading := make(chan struct{})
	signal := sync.OnceFunc(func() { close(reading) })
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Body = readSignal{r.Body, signal}
		tb.Handler().ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	first, second := tb.submit(t, "d1", alice), tb.submit(t, "d2", alice)
	body1, body2 := finalResult("d1"), finalResult("d2")
	pad := func(b []byte) []byte { return append(b, bytes.Repeat([]byte(" "), 3000-len(b))...) }
	body1, body2 = pad(body1), pad(body2)

	// The first callback's body comes slowly: its half, then the rest later.
	pr, pw := io.Pipe()
	t.Cleanup(func() { pw.Close() }) // before srv.Close, which waits for the handler
	done := make(chan int, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+CallbackPath+first, pr)
		req.ContentLength = int64(len(body1))
		resp, err := srv.Client().Do(req)
		if err != nil {
			done <- 0
			return
		}
		resp.Body.Close()
		done <- resp.StatusCode
	}()
	if _, err := pw.Write(body1[:1500]); err != nil {
		t.Fatal(err)
	}
	select { // the handler reads it, holding 3000 of 4096 bytes
	case <-reading:
	case <-time.After(30 * time.Second):
		t.Fatal("the first callback's body was not read within 30 s")
	}

	req, _ := http.NewRequest(http.MethodPost, srv.URL+CallbackPath+second, bytes.NewReader(body2))
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	answer, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" || !bytes.HasPrefix(answer, []byte(`{"err":`)) {
		t.Errorf("second callback while the first is read = %d %s (Retry-After %q), want 503 with Retry-After in Core's format",
			resp.StatusCode, answer, resp.Header.Get("Retry-After"))
	}
	if n := tb.Callbacks()[OutcomeBusy]; n != 1 {
		t.Errorf("Callbacks()[busy] = %v, want 1", n)
	}
	wantPoll(t, tb.Bridge, "d2", alice, Pending, InProgress("d2"))

	if _, err := pw.Write(body1[1500:]); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	if code := <-done; code != http.StatusOK {
		t.Fatalf("first callback = %d, want 200", code)
	}
	if code := post(t, srv, second, body2); code != http.StatusOK {
		t.Errorf("second callback delivered again = %d, want 200", code)
	}
	wantPoll(t, tb.Bridge, "d1", alice, Stored, body1)
	wantPoll(t, tb.Bridge, "d2", alice, Stored, body2)
}

// readSignal is a request body that calls read before each read.
type readSignal struct {
	io.ReadCloser
	read func()
}

func (r readSignal) Read(p []byte) (int, error) {
	r.read()
	return r.ReadCloser.Read(p)
}

// TestLoggedOut: once Core ended a session (LoggedOut), no stored result nor pending
// answer is given to that owner's polls (Miss: Core decides), for the store's time to
// live; other owners are untouched, and clients without an apikey have no session to
// end.
func TestLoggedOut(t *testing.T) {
	tb := newTestBridge(t, Options{})
	srv := httptest.NewServer(tb.Handler())
	t.Cleanup(srv.Close)
	secret := tb.submit(t, "done", alice)
	if code := post(t, srv, secret, finalResult("done")); code != http.StatusOK {
		t.Fatalf("callback = %d, want 200", code)
	}
	tb.submit(t, "running", alice)
	tb.submit(t, "bobs", bob)
	nobody := OwnerOf("")
	tb.submit(t, "anon", nobody)
	wantPoll(t, tb.Bridge, "done", alice, Stored, finalResult("done"))

	tb.LoggedOut(alice)
	tb.LoggedOut(nobody)
	wantPoll(t, tb.Bridge, "done", alice, Miss, nil)
	wantPoll(t, tb.Bridge, "running", alice, Miss, nil)
	wantPoll(t, tb.Bridge, "bobs", bob, Pending, InProgress("bobs"))
	wantPoll(t, tb.Bridge, "anon", nobody, Pending, InProgress("anon"))

	tb.clock.Add(25 * time.Hour) // past the store's time to live: the mark is gone
	wantPoll(t, tb.Bridge, "bobs", bob, Miss, nil)
	if e := tb.store.Lookup("x", alice); e.Revoked {
		t.Errorf("Lookup by alice a day later = %+v, want her session's mark expired", e)
	}
}

// TestCallbackContentType: a stored result keeps Core's JSON media type as Core spelt
// it (parameters, case), and is served as application/json when Core labelled it
// otherwise, a look-alike ("application/jsonp") included: the body is a JSON object.
func TestCallbackContentType(t *testing.T) {
	tb := newTestBridge(t, Options{})
	srv := httptest.NewServer(tb.Handler())
	t.Cleanup(srv.Close)
	for i, tc := range []struct{ sent, want string }{
		{"application/json; charset=utf-8", "application/json; charset=utf-8"},
		{"Application/JSON", "Application/JSON"},
		{"application/jsonp", "application/json"},
		{"application/json-patch+json", "application/json"},
		{"text/html", "application/json"},
		{"", "application/json"},
	} {
		id := fmt.Sprintf("ct%d", i)
		secret := tb.submit(t, id, alice)
		req, _ := http.NewRequest(http.MethodPost, srv.URL+CallbackPath+secret, bytes.NewReader(finalResult(id)))
		req.Header.Set("Content-Type", tc.sent)
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("callback with Content-Type %q = %d, want 200", tc.sent, resp.StatusCode)
		}
		if a := tb.Poll(id, alice); a.Source != Stored || a.ContentType != tc.want {
			t.Errorf("callback with Content-Type %q: served %v with %q, want stored with %q", tc.sent, a.Source, a.ContentType, tc.want)
		}
	}
}

// lookupHook is a Store that runs once, after a Lookup was answered, what then happens
// between it and the rest of a poll.
type lookupHook struct {
	Store
	after func()
}

func (s *lookupHook) Lookup(dataID string, owner Owner) Entry {
	e := s.Store.Lookup(dataID, owner)
	if f := s.after; f != nil {
		s.after = nil
		f()
	}
	return e
}

// TestPollRacingTheResult: a result stored between a poll's look-up in the store and
// its look at the pending ids (a callback, or Core's final answer to another poll) is
// the poll's answer: before, the poll found neither, went to Core as a miss, and the
// submitter got the route's limit answer (503) for its own file.
func TestPollRacingTheResult(t *testing.T) {
	for _, by := range []string{"callback", "observe"} {
		t.Run(by, func(t *testing.T) {
			tb := newTestBridge(t, Options{})
			hook := &lookupHook{Store: tb.store}
			b, err := New(Options{CallbackURL: "http://127.0.0.1:9010", Store: hook, Now: tb.clock.Now})
			if err != nil {
				t.Fatal(err)
			}
			_, secret, err := b.Callback()
			if err != nil {
				t.Fatal(err)
			}
			b.Submitted("r1", secret, alice)
			wantPoll(t, b, "r1", alice, Pending, InProgress("r1"))
			final := finalResult("r1")
			hook.after = func() {
				if by == "observe" {
					b.Observe("r1", alice, final, "application/json")
					return
				}
				srv := httptest.NewServer(b.Handler())
				defer srv.Close()
				if code := post(t, srv, secret, final); code != http.StatusOK {
					t.Errorf("callback = %d, want 200", code)
				}
			}
			wantPoll(t, b, "r1", alice, Stored, final)
			wantPoll(t, b, "r1", bob, Miss, nil)
		})
	}
}
