package bridge

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/mdproxy/mdproxy/internal/redistest"
)

// idWeight is what a pending id without a reply counts against MaxPendingBytes.
func idWeight(dataID string) int64 { return pendingOverhead + int64(len(dataID)) }

// wantDropped checks PendingDropped and PendingBytes.
func wantDropped(t *testing.T, b *Bridge, dropped uint64, bytes int64) {
	t.Helper()
	if got := b.PendingDropped(); got != dropped {
		t.Errorf("PendingDropped() = %d, want %d", got, dropped)
	}
	if got := b.PendingBytes(); got != bytes {
		t.Errorf("PendingBytes() = %d, want %d", got, bytes)
	}
}

// TestPendingOldestFirst: beyond MaxPendingBytes the oldest pending id is dropped and
// counted; its polls are misses (Core decides) and its callback is refused; an id whose
// callback came leaves the middle of the order and its room to the next; a data_id
// weighs its length, and one heavier than the whole bound is not held.
func TestPendingOldestFirst(t *testing.T) {
	w := idWeight("p0")
	tb := newTestBridge(t, Options{MaxPendingBytes: 3 * w})
	srv := httptest.NewServer(tb.Handler())
	t.Cleanup(srv.Close)
	secrets := map[string]string{}
	for _, id := range []string{"p0", "p1", "p2"} {
		secrets[id] = tb.submit(t, id, alice)
	}
	wantDropped(t, tb.Bridge, 0, 3*w)
	secrets["p3"] = tb.submit(t, "p3", alice)
	wantDropped(t, tb.Bridge, 1, 3*w)
	wantPoll(t, tb.Bridge, "p0", alice, Miss, nil)
	for _, id := range []string{"p1", "p2", "p3"} {
		wantPoll(t, tb.Bridge, id, alice, Pending, InProgress(id))
	}
	if code := post(t, srv, secrets["p0"], finalResult("p0")); code != http.StatusNotFound {
		t.Errorf("callback of the dropped p0 = %d, want 404", code)
	}
	if n := tb.PendingLen(); n != 3 {
		t.Errorf("PendingLen() = %d, want 3", n)
	}

	// p2's callback takes it out of the middle: p4 fits, then p5 drops p1, the oldest.
	if code := post(t, srv, secrets["p2"], finalResult("p2")); code != http.StatusOK {
		t.Fatalf("callback of p2 = %d, want 200", code)
	}
	wantDropped(t, tb.Bridge, 1, 2*w)
	tb.submit(t, "p4", alice)
	wantDropped(t, tb.Bridge, 1, 3*w)
	tb.submit(t, "p5", alice)
	wantDropped(t, tb.Bridge, 2, 3*w)
	wantPoll(t, tb.Bridge, "p1", alice, Miss, nil)
	wantPoll(t, tb.Bridge, "p2", alice, Stored, finalResult("p2"))
	for _, id := range []string{"p3", "p4", "p5"} {
		wantPoll(t, tb.Bridge, id, alice, Pending, InProgress(id))
	}

	// A longer data_id weighs more: one that weighs nearly two ids drops two.
	long := strings.Repeat("a", int(w)+1)
	tb.submit(t, long, alice)
	wantDropped(t, tb.Bridge, 4, w+idWeight(long))
	wantPoll(t, tb.Bridge, "p4", alice, Miss, nil)
	wantPoll(t, tb.Bridge, "p5", alice, Pending, InProgress("p5"))
	wantPoll(t, tb.Bridge, long, alice, Pending, InProgress(long))
	// One heavier than the bound drops every id, itself last.
	huge := strings.Repeat("h", int(3*w))
	tb.submit(t, huge, alice)
	wantDropped(t, tb.Bridge, 7, 0)
	wantPoll(t, tb.Bridge, huge, alice, Miss, nil)
	if n := tb.PendingLen(); n != 0 {
		t.Errorf("PendingLen() = %d, want 0", n)
	}
}

// TestPendingBound: many submissions whose callbacks never come, and no poll (clients
// that fire and forget, Core that cannot reach the listener): the pending ids stay
// within MaxPendingBytes, in weight and in the heap they take, the newest kept and the
// others dropped and counted.
func TestPendingBound(t *testing.T) {
	const (
		max         = 4 << 20
		submissions = 60_000
	)
	tb := newTestBridge(t, Options{MaxPendingBytes: max})
	id := func(i int) string { return fmt.Sprintf("%032x", i) }
	secrets := make([]string, submissions)
	for i := range secrets {
		_, s, err := tb.Callback()
		if err != nil {
			t.Fatal(err)
		}
		secrets[i] = s
	}
	tb.mu.Lock()
	clear(tb.issued) // Submitted would forget them one by one
	tb.mu.Unlock()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i, s := range secrets {
		tb.Submitted(id(i), s, alice)
		if i%5000 == 0 && tb.PendingBytes() > max {
			t.Fatalf("PendingBytes() = %d after %d submissions, want at most %d", tb.PendingBytes(), i+1, max)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)

	held := int(max / idWeight(id(0)))
	if n := tb.PendingLen(); n != held {
		t.Errorf("PendingLen() = %d, want %d (the bound / an id's weight)", n, held)
	}
	wantDropped(t, tb.Bridge, uint64(submissions-held), int64(held)*idWeight(id(0)))
	wantPoll(t, tb.Bridge, id(0), alice, Miss, nil)
	wantPoll(t, tb.Bridge, id(submissions-held-1), alice, Miss, nil)
	wantPoll(t, tb.Bridge, id(submissions-held), alice, Pending, InProgress(id(submissions-held)))
	wantPoll(t, tb.Bridge, id(submissions-1), alice, Pending, InProgress(id(submissions-1)))

	grown := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("%d submissions, %d held: heap grown by %d bytes, %d an id (its 32-byte data_id included, weighed %d)",
		submissions, held, grown, grown/int64(held), idWeight(id(0)))
	if grown > max {
		t.Errorf("heap grew by %d bytes, want at most the bound %d", grown, max)
	}
	runtime.KeepAlive(secrets)
}

// TestPendingDropLogged: the drops over MaxPendingBytes are logged once a burst, a
// burst ending after a minute without a drop; each line tells the bound, the ids held
// and the drops so far.
func TestPendingDropLogged(t *testing.T) {
	var logs bytes.Buffer
	w := idWeight("p00")
	tb := newTestBridge(t, Options{MaxPendingBytes: 2 * w, Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	type line struct {
		Level        string
		Msg          string
		MaxBytes     int64  `json:"max_bytes"`
		PendingIDs   int    `json:"pending_ids"`
		DroppedTotal uint64 `json:"dropped_total"`
	}
	lines := func() []line {
		t.Helper()
		var out []line
		for _, s := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
			if s == "" {
				continue
			}
			var l line
			if err := json.Unmarshal([]byte(s), &l); err != nil {
				t.Fatalf("log line %q: %v", s, err)
			}
			out = append(out, l)
		}
		return out
	}
	n := 0
	submit := func() {
		tb.submit(t, fmt.Sprintf("p%02d", n), alice)
		n++
	}
	submit()
	submit()
	if got := lines(); len(got) != 0 {
		t.Fatalf("logged %+v within the bound, want nothing", got)
	}
	// A burst: a drop a second for 30 s, then one 59 s after the last.
	for range 30 {
		submit()
		tb.clock.Add(time.Second)
	}
	tb.clock.Add(58 * time.Second)
	submit()
	got := lines()
	if len(got) != 1 {
		t.Fatalf("logged %d lines for one burst of 31 drops, want 1: %+v", len(got), got)
	}
	if l := got[0]; l.Level != "WARN" || !strings.Contains(l.Msg, "MDPROXY_BRIDGE_PENDING_MAX_BYTES") || l.MaxBytes != 2*w || l.PendingIDs != 2 || l.DroppedTotal != 1 {
		t.Errorf("first line %+v, want WARN naming MDPROXY_BRIDGE_PENDING_MAX_BYTES, max_bytes %d, pending_ids 2, dropped_total 1", l, 2*w)
	}
	// A minute without a drop ends the burst: the next drop is logged again.
	tb.clock.Add(time.Minute)
	submit()
	submit()
	got = lines()
	if len(got) != 2 {
		t.Fatalf("logged %d lines for two bursts, want 2: %+v", len(got), got)
	}
	if l := got[1]; l.DroppedTotal != 32 {
		t.Errorf("second line dropped_total %d, want 32", l.DroppedTotal)
	}
	if d := tb.PendingDropped(); d != 33 {
		t.Errorf("PendingDropped() = %d, want 33", d)
	}
}

// TestPendingAnswersBounded: Core's replies held as pending answers count in
// MaxPendingBytes with the ids; a reply that would pass it leaves the id its earlier
// answer and drops no id, and the room comes back when an id goes; a new id that needs
// room drops the oldest, its reply with it.
func TestPendingAnswersBounded(t *testing.T) {
	reply := func(id string, progress int) []byte { return result(id, progress, 255) }
	const ct = "application/json"
	r := replyWeight(reply("p0", 50), ct)
	w := idWeight("p0")
	tb := newTestBridge(t, Options{MaxPendingBytes: 3*w + 2*r + r/2}) // three ids, two replies
	for _, id := range []string{"p0", "p1", "p2"} {
		tb.submit(t, id, alice)
	}
	for _, id := range []string{"p0", "p1", "p2"} {
		tb.Observe(id, alice, reply(id, 50), ct)
	}
	wantPoll(t, tb.Bridge, "p0", alice, Pending, reply("p0", 50))
	wantPoll(t, tb.Bridge, "p1", alice, Pending, reply("p1", 50))
	wantPoll(t, tb.Bridge, "p2", alice, Pending, InProgress("p2")) // over the bound: its earlier answer
	wantDropped(t, tb.Bridge, 0, 3*w+2*r)
	// A newer reply of an id that holds one replaces it within the bound.
	tb.Observe("p1", alice, reply("p1", 60), ct)
	wantPoll(t, tb.Bridge, "p1", alice, Pending, reply("p1", 60))
	// p0 goes (Core lost it): its room is p2's reply's.
	tb.Gone("p0", alice)
	tb.Observe("p2", alice, reply("p2", 70), ct)
	wantPoll(t, tb.Bridge, "p2", alice, Pending, reply("p2", 70))
	wantDropped(t, tb.Bridge, 0, 2*w+2*r)
	// p3 and p4 fit beside them; p5 drops p1, the oldest, and its reply.
	tb.submit(t, "p3", alice)
	wantDropped(t, tb.Bridge, 0, 3*w+2*r)
	tb.submit(t, "p4", alice)
	wantDropped(t, tb.Bridge, 1, 3*w+r)
	wantPoll(t, tb.Bridge, "p1", alice, Miss, nil)
	wantPoll(t, tb.Bridge, "p2", alice, Pending, reply("p2", 70))
}

// TestRedisSharedBound: with a shared store, the other replicas' ids that polls meet
// here count in MaxPendingBytes as this replica's own: the oldest is dropped beyond it,
// and met again at its next poll, still answered as pending from the store. This
// replica's own id dropped stays pending in the store, and its polls are answered as
// another replica's.
func TestRedisSharedBound(t *testing.T) {
	srv := redistest.Start(t)
	clock := newFakeClock()
	a := newReplica(t, srv, clock, Options{})
	w := idWeight("x0")
	b := newReplica(t, srv, clock, Options{MaxPendingBytes: 2 * w})
	for _, id := range []string{"x0", "x1", "x2"} {
		a.submit(t, id)
	}
	for _, id := range []string{"x0", "x1", "x2"} {
		wantPoll(t, b.Bridge, id, alice, Pending, InProgress(id))
	}
	wantDropped(t, b.Bridge, 1, 2*w) // x0 went for x2
	wantPoll(t, b.Bridge, "x0", alice, Pending, InProgress("x0"))
	wantDropped(t, b.Bridge, 2, 2*w) // x0 is back, x1 went
	if n := b.PendingLen(); n != 0 {
		t.Errorf("B's PendingLen() = %d, want 0 (none of its own)", n)
	}

	b.submit(t, "y0") // drops x2
	b.submit(t, "y1") // drops x0
	b.submit(t, "y2") // drops y0, which the store still holds
	wantDropped(t, b.Bridge, 5, 2*w)
	if n := b.PendingLen(); n != 2 {
		t.Errorf("B's PendingLen() = %d, want 2", n)
	}
	wantPoll(t, a.Bridge, "y0", alice, Pending, InProgress("y0"))
	wantPoll(t, b.Bridge, "y0", alice, Pending, InProgress("y0"))
	if n := b.PendingLen(); n != 1 {
		t.Errorf("B's PendingLen() = %d, want 1 (y0 is met as another's; y1 went for it)", n)
	}
}
