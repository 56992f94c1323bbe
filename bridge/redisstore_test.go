package bridge

import (
	"bytes"
	"context"
	"encoding/hex"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/mdproxy/mdproxy/internal/redistest"
)

// Settings of the RedisStores under test. testTimeout is generous, so that a loaded
// machine never turns an answer of a running Redis into a miss; the outage tests use
// DefaultRedisTimeout, the one mdproxy runs with.
const (
	testTTL        = time.Hour
	testPendingTTL = 2 * time.Hour
	testMaxBytes   = 64 << 20
	testTimeout    = 5 * time.Second
)

// newRedisStore returns a RedisStore on a new client of srv with the test settings and
// the given prefix and timeout.
func newRedisStore(t *testing.T, srv *redistest.Server, prefix string, timeout time.Duration) *RedisStore {
	t.Helper()
	s, err := NewRedisStore(srv.Client(t), RedisStoreOptions{Prefix: prefix, TTL: testTTL, PendingTTL: testPendingTTL, Timeout: timeout, MaxBytes: testMaxBytes})
	if err != nil {
		t.Fatalf("NewRedisStore = %v, want no error", err)
	}
	t.Cleanup(s.Close) // the memory of results Redis did not take, if any
	return s
}

// replica is a Bridge on a RedisStore of its own client: one mdproxy replica.
type replica struct {
	*Bridge
	store *RedisStore
	srv   *httptest.Server // its callback listener
}

// newReplica returns a replica on srv with o's settings (CallbackURL, Store and Now
// filled in), on clock.
func newReplica(t *testing.T, srv *redistest.Server, clock *fakeClock, o Options) replica {
	t.Helper()
	store := newRedisStore(t, srv, "", testTimeout)
	o.CallbackURL = "http://127.0.0.1:9010"
	o.Store = store
	o.Now = clock.Now
	o.PendingTTL = testPendingTTL
	b, err := New(o)
	if err != nil {
		t.Fatalf("New = %v, want no error", err)
	}
	cb := httptest.NewServer(b.Handler())
	t.Cleanup(cb.Close)
	return replica{b, store, cb}
}

// pttl returns the time to live of key in Redis: negative when it has none (-1) or does
// not exist (-2), as PTTL answers.
func pttl(t *testing.T, rdb *redis.Client, key string) time.Duration {
	t.Helper()
	d, err := rdb.PTTL(context.Background(), key).Result()
	if err != nil {
		t.Fatalf("PTTL %s = %v", key, err)
	}
	return d
}

// wantTTL checks that key expires, within max.
func wantTTL(t *testing.T, rdb *redis.Client, key string, max time.Duration) {
	t.Helper()
	if d := pttl(t, rdb, key); d <= 0 || d > max {
		t.Errorf("PTTL %s = %v, want in (0, %v]", key, d, max)
	}
}

// wantNoKey checks that key does not exist.
func wantNoKey(t *testing.T, rdb *redis.Client, key string) {
	t.Helper()
	if n, err := rdb.Exists(context.Background(), key).Result(); err != nil || n != 0 {
		t.Errorf("EXISTS %s = %d, %v, want 0", key, n, err)
	}
}

func TestNewRedisStoreErrors(t *testing.T) {
	good := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true})
	defer good.Close()
	plain := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer plain.Close()
	tests := []struct {
		name        string
		rdb         redis.UniversalClient
		ttl, pttl   time.Duration
		timeout     time.Duration
		max         int64
		wantErrPart string
	}{
		{"no client", nil, time.Hour, time.Hour, 0, 1 << 20, "no Redis client"},
		{"no context timeout", plain, time.Hour, time.Hour, 0, 1 << 20, "ContextTimeoutEnabled"},
		{"ttl", good, 0, time.Hour, 0, 1 << 20, "time to live"},
		{"pending ttl", good, time.Hour, -time.Second, 0, 1 << 20, "pending time to live"},
		{"max bytes", good, time.Hour, time.Hour, 0, 0, "maximum size"},
		{"timeout", good, time.Hour, time.Hour, -time.Millisecond, 1 << 20, "negative"},
	}
	for _, tc := range tests {
		s, err := NewRedisStore(tc.rdb, RedisStoreOptions{TTL: tc.ttl, PendingTTL: tc.pttl, Timeout: tc.timeout, MaxBytes: tc.max})
		if err == nil || !strings.Contains(err.Error(), tc.wantErrPart) {
			t.Errorf("%s: NewRedisStore = %v, %v, want an error about %q", tc.name, s, err, tc.wantErrPart)
		}
	}
	s, err := NewRedisStore(good, RedisStoreOptions{TTL: time.Hour, PendingTTL: time.Hour, MaxBytes: 1 << 20})
	if err != nil {
		t.Fatalf("NewRedisStore with a Redis down = %v, want no error (it does not dial)", err)
	}
	if s.prefix != DefaultRedisPrefix || s.timeout != DefaultRedisTimeout {
		t.Errorf("defaults: prefix %q, timeout %v, want %q, %v", s.prefix, s.timeout, DefaultRedisPrefix, DefaultRedisTimeout)
	}
}

func TestRedisStore(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	s := newRedisStore(t, srv, "", testTimeout)
	ctx := context.Background()

	if _, ok := s.Get("a"); ok {
		t.Errorf("Get(a) on an empty store found something")
	}
	if e := s.Lookup("a", alice); e.Stored || e.IsPending {
		t.Errorf("Lookup(a) on an empty store = %+v, want nothing", e)
	}

	// Pending, then its result, which ends it.
	at := time.Date(2026, 1, 2, 3, 4, 5, 6e6, time.UTC)
	s.PutPending("a", PendingID{Owner: alice, Submitted: at})
	e := s.Lookup("a", alice)
	if !e.IsPending || e.Pending.Owner != alice || !e.Pending.Submitted.Equal(at) || e.Stored {
		t.Errorf("Lookup(a) after PutPending = %+v, want pending for alice at %v", e, at)
	}
	wantTTL(t, rdb, "mdproxy:pending:{a}", testPendingTTL)
	if got, _ := rdb.HGet(ctx, "mdproxy:pending:{a}", "owner").Result(); got != hex.EncodeToString(alice[:]) {
		t.Errorf("the pending id's owner in Redis = %q, want alice's digest in hex", got)
	}
	// Core's bytes, whatever they are, come back as they went.
	body := append(finalResult("a"), 0xff, 0x00, '\n', 0xc3)
	want := Result{Body: body, ContentType: "application/json; charset=utf-8", Owner: alice}
	s.Put("a", want)
	got, ok := s.Get("a")
	if !ok || !bytes.Equal(got.Body, want.Body) || got.ContentType != want.ContentType || got.Owner != want.Owner {
		t.Errorf("Get(a) = %+v, %v, want %+v", got, ok, want)
	}
	e = s.Lookup("a", alice)
	if !e.Stored || !bytes.Equal(e.Result.Body, body) || e.Result.ContentType != want.ContentType || e.IsPending {
		t.Errorf("Lookup(a) after Put = %+v, want the result and no pending id", e)
	}
	// Another client's poll learns whose result it is, not the result: Redis sends no
	// body (a result may weigh megabytes, and Core decides that client's access).
	if e := s.Lookup("a", bob); !e.Stored || e.Result.Owner != alice || e.Result.Body != nil || e.Result.ContentType != "" {
		t.Errorf("bob's Lookup(a) = %+v, want alice's result named, without its body or type", e)
	}
	wantTTL(t, rdb, "mdproxy:result:{a}", testTTL)
	wantNoKey(t, rdb, "mdproxy:pending:{a}")
	keys, err := rdb.Keys(ctx, "*").Result()
	if err != nil || len(keys) != 1 {
		t.Errorf("keys in Redis = %q, %v, want only mdproxy:result:{a}", keys, err)
	}
	for _, k := range keys {
		if v, _ := rdb.HGetAll(ctx, k).Result(); strings.Contains(strings.Join(mapValues(v), " "), "alice-key") {
			t.Errorf("%s holds an apikey: %v", k, v)
		}
	}

	// A pending id is not recorded over a stored result (a callback stored first).
	s.PutPending("a", PendingID{Owner: alice, Submitted: at})
	if e := s.Lookup("a", alice); e.IsPending {
		t.Errorf("Lookup(a) after a PutPending over a result = %+v, want no pending id", e)
	}

	// Replaced, not added.
	s.Put("a", Result{Body: infectedResult("a"), ContentType: "application/json", Owner: bob})
	if got, _ := s.Get("a"); got.Owner != bob || !bytes.Equal(got.Body, infectedResult("a")) {
		t.Errorf("after a second Put, Get(a) = owner %x, %s, want bob's", got.Owner[:4], got.Body)
	}

	// DropPending only for the owner.
	s.PutPending("b", PendingID{Owner: alice, Submitted: at})
	s.DropPending("b", bob)
	if e := s.Lookup("b", alice); !e.IsPending {
		t.Errorf("Lookup(b) after another owner's DropPending = %+v, want still pending", e)
	}
	s.DropPending("b", alice)
	if e := s.Lookup("b", alice); e.IsPending {
		t.Errorf("Lookup(b) after DropPending = %+v, want none", e)
	}

	// The prefix is the store's.
	other := newRedisStore(t, srv, "other:", testTimeout)
	if _, ok := other.Get("a"); ok {
		t.Errorf("Get(a) with another prefix found mdproxy:'s result")
	}
	other.Put("a", want)
	wantTTL(t, rdb, "other:result:{a}", testTTL)
}

func mapValues(m map[string]string) []string {
	var v []string
	for _, s := range m {
		v = append(v, s)
	}
	return v
}

// TestRedisStoreLarge: a result over a sixteenth of maxBytes is not kept, and one just
// under it is; the declined Put still ends the id's pending state.
func TestRedisStoreLarge(t *testing.T) {
	srv := redistest.Start(t)
	const max = 64 << 10
	s, err := NewRedisStore(srv.Client(t), RedisStoreOptions{TTL: testTTL, PendingTTL: testPendingTTL, Timeout: testTimeout, MaxBytes: max})
	if err != nil {
		t.Fatal(err)
	}
	fits := max/16 - entryOverhead - len("fits")
	s.Put("fits", Result{Body: make([]byte, fits)})
	s.PutPending("bigs", PendingID{Owner: alice, Submitted: time.Now()})
	s.Put("bigs", Result{Body: make([]byte, fits+1)})
	if _, ok := s.Get("fits"); !ok {
		t.Errorf("Get(fits) found nothing, want a result of max/16 kept")
	}
	if e := s.Lookup("bigs", alice); e.Stored || e.IsPending {
		t.Errorf("Lookup(bigs) = stored %v, pending %v, want neither: too large, and no longer pending", e.Stored, e.IsPending)
	}
	if s.Len() != 1 || s.Bytes() != max/16 {
		t.Errorf("Len, Bytes = %d, %d, want 1, %d", s.Len(), s.Bytes(), max/16)
	}
}

// TestRedisStoreLenBytes: Len and Bytes count what this replica put in the last ttl.
func TestRedisStoreLenBytes(t *testing.T) {
	srv := redistest.Start(t)
	s := newRedisStore(t, srv, "", testTimeout)
	clock := newFakeClock()
	s.now = clock.Now
	r := Result{Body: finalResult("a"), ContentType: "application/json"}
	w := int64(weightOf("a", r))
	s.Put("a", r)
	clock.Add(testTTL / 2)
	s.Put("b", r)
	if s.Len() != 2 || s.Bytes() != 2*w {
		t.Errorf("Len, Bytes = %d, %d, want 2, %d", s.Len(), s.Bytes(), 2*w)
	}
	clock.Add(testTTL / 2)
	if s.Len() != 1 || s.Bytes() != w {
		t.Errorf("a ttl after the first Put: Len, Bytes = %d, %d, want 1, %d", s.Len(), s.Bytes(), w)
	}
	clock.Add(testTTL)
	if s.Len() != 0 || s.Bytes() != 0 {
		t.Errorf("a ttl after the last Put: Len, Bytes = %d, %d, want 0, 0", s.Len(), s.Bytes())
	}
	// Another replica's Put is not counted here.
	newRedisStore(t, srv, "", testTimeout).Put("c", r)
	if s.Len() != 0 {
		t.Errorf("Len after another store's Put = %d, want 0", s.Len())
	}
}

// TestRedisReplicas: two replicas on one Redis. A file submitted through A is pending
// for B, which answers its polls without Core and asks Core only when its callback looks
// overdue from the shared submission time; the result A's listener takes is served by B
// byte for byte, to its owner only.
func TestRedisReplicas(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	const refresh = time.Minute
	clock := newFakeClock()
	a := newReplica(t, srv, clock, Options{Refresh: refresh})
	b := newReplica(t, srv, clock, Options{Refresh: refresh})

	_, secret, err := a.Callback()
	if err != nil {
		t.Fatal(err)
	}
	a.Submitted("x", secret, alice)
	wantTTL(t, rdb, "mdproxy:pending:{x}", testPendingTTL)
	if n := b.PendingLen(); n != 0 {
		t.Errorf("B's PendingLen = %d, want 0 (it counts its own submissions)", n)
	}

	// Pending for B, without Core, as for A.
	wantPoll(t, b.Bridge, "x", alice, Pending, InProgress("x"))
	wantPoll(t, a.Bridge, "x", alice, Pending, InProgress("x"))
	wantPoll(t, b.Bridge, "x", bob, Miss, nil) // someone else's id: Core decides
	wantPoll(t, b.Bridge, "y", alice, Miss, nil)

	// B's overdue rule runs from the shared submission time, at most once per refresh.
	clock.Add(refresh - time.Second)
	wantPoll(t, b.Bridge, "x", alice, Pending, InProgress("x"))
	clock.Add(time.Second)
	if got := b.Poll("x", alice).Source; got != Overdue {
		t.Fatalf("B's poll refresh after the submission = %v, want overdue", got)
	}
	wantPoll(t, b.Bridge, "x", alice, Pending, InProgress("x"))
	// Core's answer to B's question, not final, is B's pending answer from then on.
	running := result("x", 40, inProgressResult)
	b.Observe("x", alice, running, "application/json")
	wantPoll(t, b.Bridge, "x", alice, Pending, running)
	// bob's final answer from Core does not take alice's place.
	b.Observe("x", bob, finalResult("x"), "application/json")
	wantPoll(t, b.Bridge, "x", bob, Miss, nil)
	// A, which asked Core nothing yet, asks it too (each replica once per refresh).
	if got := a.Poll("x", alice); got.Source != Overdue || !bytes.Equal(got.Body, InProgress("x")) {
		t.Errorf("A's poll = %v %s, want overdue with the in-progress answer", got.Source, got.Body)
	}

	// Core calls A back; B serves the result byte for byte, to alice only.
	body := infectedResult("x")
	if code := post(t, a.srv, secret, body); code != 200 {
		t.Fatalf("callback to A = %d, want 200", code)
	}
	wantPoll(t, b.Bridge, "x", alice, Stored, body)
	wantPoll(t, a.Bridge, "x", alice, Stored, body)
	wantPoll(t, b.Bridge, "x", bob, Miss, nil)
	if a := b.Poll("x", alice); a.ContentType != "application/json" {
		t.Errorf("B's stored answer's Content-Type = %q, want application/json", a.ContentType)
	}
	wantTTL(t, rdb, "mdproxy:result:{x}", testTTL)
	wantNoKey(t, rdb, "mdproxy:pending:{x}")
	if n := counts(t, a.Bridge)[OutcomeStored]; n != 1 {
		t.Errorf("A's stored callbacks = %v, want 1", n)
	}
}

// TestRedisPendingLost: when Redis loses a pending id (restarted empty, flushed, or
// evicted it under maxmemory), the replica that submitted it records it again at its
// next poll of the id, so that the other replicas answer its polls as pending again,
// without Core and its limit; and the callback still stores the result for all.
func TestRedisPendingLost(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	clock := newFakeClock()
	a := newReplica(t, srv, clock, Options{Refresh: time.Minute})
	b := newReplica(t, srv, clock, Options{Refresh: time.Minute})
	_, secret, err := a.Callback()
	if err != nil {
		t.Fatal(err)
	}
	a.Submitted("x", secret, alice)
	wantPoll(t, b.Bridge, "x", alice, Pending, InProgress("x"))

	if err := rdb.FlushAll(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	wantPoll(t, b.Bridge, "x", alice, Miss, nil) // lost: B cannot know
	wantPoll(t, a.Bridge, "x", alice, Pending, InProgress("x"))
	wantTTL(t, rdb, "mdproxy:pending:{x}", testPendingTTL)
	wantPoll(t, b.Bridge, "x", alice, Pending, InProgress("x"))
	wantPoll(t, b.Bridge, "x", bob, Miss, nil)

	body := infectedResult("x")
	if code := post(t, a.srv, secret, body); code != 200 {
		t.Fatalf("callback to A = %d, want 200", code)
	}
	wantPoll(t, b.Bridge, "x", alice, Stored, body)
	wantNoKey(t, rdb, "mdproxy:pending:{x}")
	// A stored result is never made pending again.
	wantPoll(t, a.Bridge, "x", alice, Stored, body)
	wantNoKey(t, rdb, "mdproxy:pending:{x}")
}

// TestRedisLoggedOut: a session that Core ended through one replica gets nothing the
// bridge kept from any replica: the mark is in Redis, for the store's time to live.
func TestRedisLoggedOut(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	clock := newFakeClock()
	a := newReplica(t, srv, clock, Options{})
	b := newReplica(t, srv, clock, Options{})
	a.submit(t, "x")
	b.store.Put("y", Result{Body: finalResult("y"), ContentType: "application/json", Owner: alice})
	wantPoll(t, b.Bridge, "y", alice, Stored, finalResult("y"))
	wantPoll(t, b.Bridge, "x", alice, Pending, InProgress("x"))

	a.LoggedOut(alice)
	wantTTL(t, rdb, "mdproxy:revoked:"+hex.EncodeToString(alice[:]), testTTL)
	wantPoll(t, b.Bridge, "y", alice, Miss, nil)
	wantPoll(t, b.Bridge, "x", alice, Miss, nil)
	wantPoll(t, a.Bridge, "x", alice, Miss, nil)
	b.store.Put("z", Result{Body: finalResult("z"), ContentType: "application/json", Owner: bob})
	wantPoll(t, a.Bridge, "z", bob, Stored, finalResult("z"))
}

// TestRedisLoggedOutWhileDown: a logout seen by a replica while Redis does not answer
// holds on that replica at once, and reaches the other replicas once Redis answers
// again: the replica writes its mark again at its next look-up of the owner's.
func TestRedisLoggedOutWhileDown(t *testing.T) {
	srv := redistest.Start(t)
	clock := newFakeClock()
	a := newReplica(t, srv, clock, Options{})
	b := newReplica(t, srv, clock, Options{})
	srv.Stop()
	// A result Core called back while Redis was down: kept in A's memory.
	a.store.Put("y", Result{Body: finalResult("y"), ContentType: "application/json", Owner: alice})
	wantPoll(t, a.Bridge, "y", alice, Stored, finalResult("y"))
	a.LoggedOut(alice) // Redis does not take it
	wantPoll(t, a.Bridge, "y", alice, Miss, nil)
	srv.Restart()
	b.store.Put("x", Result{Body: finalResult("x"), ContentType: "application/json", Owner: alice})
	deadline := time.Now().Add(30 * time.Second)
	for b.Poll("x", alice).Source != Stored {
		if time.Now().After(deadline) {
			t.Fatal("B never served the result once Redis was back")
		}
		b.store.Put("x", Result{Body: finalResult("x"), ContentType: "application/json", Owner: alice})
		time.Sleep(50 * time.Millisecond)
	}
	// A's next look-up finds Redis without its mark (its breaker lets a call through
	// within a second) and writes it again: then B refuses too.
	for {
		a.Poll("x", alice)
		if b.Poll("x", alice).Source == Miss {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("B still served the logged-out session's result 30 s after Redis came back")
		}
		time.Sleep(50 * time.Millisecond)
	}
	wantPoll(t, a.Bridge, "x", alice, Miss, nil)
}

// TestRedisReplicasObserve: the final result Core gives B's question about A's
// submission is stored for every replica, and B's Gone makes it no longer pending.
func TestRedisReplicasObserve(t *testing.T) {
	srv := redistest.Start(t)
	clock := newFakeClock()
	a := newReplica(t, srv, clock, Options{})
	b := newReplica(t, srv, clock, Options{})

	_, secret, _ := a.Callback()
	a.Submitted("x", secret, alice)
	wantPoll(t, b.Bridge, "x", alice, Pending, InProgress("x"))
	b.Observe("x", alice, finalResult("x"), "application/json")
	wantPoll(t, a.Bridge, "x", alice, Stored, finalResult("x"))
	wantPoll(t, b.Bridge, "x", alice, Stored, finalResult("x"))
	// A callback that comes late is still taken: A's secret stayed live.
	if code := post(t, a.srv, secret, finalResult("x")); code != 200 {
		t.Errorf("late callback to A = %d, want 200", code)
	}

	_, secret, _ = a.Callback()
	a.Submitted("lost", secret, alice)
	wantPoll(t, b.Bridge, "lost", alice, Pending, InProgress("lost"))
	b.Gone("lost", bob) // not bob's to drop
	wantPoll(t, b.Bridge, "lost", alice, Pending, InProgress("lost"))
	b.Gone("lost", alice)
	wantPoll(t, b.Bridge, "lost", alice, Miss, nil)
	// A keeps its own record until its own question to Core gets 404.
	wantPoll(t, a.Bridge, "lost", alice, Pending, InProgress("lost"))
	a.Gone("lost", alice)
	wantPoll(t, a.Bridge, "lost", alice, Miss, nil)
}

// hangBound is how long a call of a RedisStore may take with Redis out or silent:
// far above the store's timeout (50 ms), so that only a call that waits on Redis
// beyond that timeout reaches it, never one a loaded machine slowed (450 ms seen).
const hangBound = 5 * time.Second

// timed runs f and fails t at once if it took longer than hangBound.
func timed(t *testing.T, what string, f func()) {
	t.Helper()
	start := time.Now()
	f()
	if d := time.Since(start); d > hangBound {
		t.Fatalf("%s took %v with Redis out, want it bounded by the store's timeout (%v is far above it)", what, d, hangBound)
	}
}

// TestRedisOutage: with Redis stopped, Get and Lookup miss and Put declines, without
// waiting on Redis (hangBound) nor a panic; a replica still answers its own
// submissions, and the other forwards them to Core. Once Redis is back, the store works
// again.
func TestRedisOutage(t *testing.T) {
	srv := redistest.Start(t)
	clock := newFakeClock()
	mk := func() replica {
		t.Helper()
		s, err := NewRedisStore(srv.Client(t), RedisStoreOptions{TTL: testTTL, PendingTTL: testPendingTTL, Timeout: DefaultRedisTimeout, MaxBytes: testMaxBytes})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Close)
		br, err := New(Options{CallbackURL: "http://127.0.0.1:9010", Store: s, Now: clock.Now})
		if err != nil {
			t.Fatal(err)
		}
		cb := httptest.NewServer(br.Handler())
		t.Cleanup(cb.Close)
		return replica{Bridge: br, store: s, srv: cb}
	}
	a, b := mk(), mk()
	a.store.Put("old", Result{Body: finalResult("old"), Owner: alice})
	a.submit(t, "x")

	srv.Stop()
	for range 3 { // the first failures and those after go-redis gave up dialling
		timed(t, "Get", func() {
			if _, ok := a.store.Get("old"); ok {
				t.Errorf("Get(old) with Redis out found it")
			}
		})
		timed(t, "Lookup", func() {
			if e := a.store.Lookup("x", alice); e.Stored || e.IsPending {
				t.Errorf("Lookup(x) with Redis out = %+v, want nothing", e)
			}
		})
		timed(t, "Put", func() { a.store.Put("new", Result{Body: finalResult("new"), Owner: alice}) })
		timed(t, "PutPending", func() { a.store.PutPending("p", PendingID{Owner: alice, Submitted: clock.Now()}) })
		timed(t, "DropPending", func() { a.store.DropPending("x", alice) })
		timed(t, "A's Poll", func() { wantPoll(t, a.Bridge, "x", alice, Pending, InProgress("x")) })
		timed(t, "B's Poll", func() { wantPoll(t, b.Bridge, "x", alice, Miss, nil) })
		timed(t, "Submitted", func() { a.submit(t, "y") })
	}
	if a.store.failures.Load() == 0 || !a.store.down.Load() {
		t.Errorf("failures %d, down %v, want failures counted and the store down", a.store.failures.Load(), a.store.down.Load())
	}
	// A result Redis did not take is kept in A's memory: A serves it, B cannot.
	if r, ok := a.store.Get("new"); !ok || !bytes.Equal(r.Body, finalResult("new")) {
		t.Errorf("A's Get(new) with Redis out = %q, %v, want the result A put during the outage", r.Body, ok)
	}
	if e := a.store.Lookup("new", alice); !e.Stored || e.Result.Owner != alice {
		t.Errorf("A's Lookup(new) with Redis out = %+v, want its result", e)
	}
	if _, ok := b.store.Get("new"); ok {
		t.Errorf("B's Get(new) found a result only A holds")
	}
	// A callback during the outage is stored (200) and its poll answered from A's memory,
	// never sent to Core (where the limit could answer 503).
	_, secret, err := a.Callback()
	if err != nil {
		t.Fatal(err)
	}
	a.Submitted("cb", secret, alice)
	if code := post(t, a.srv, secret, finalResult("cb")); code != http.StatusOK {
		t.Fatalf("callback with Redis out: status %d, want 200", code)
	}
	wantPoll(t, a.Bridge, "cb", alice, Stored, finalResult("cb"))
	wantPoll(t, a.Bridge, "cb", bob, Miss, nil)
	if a.store.Len() != 5 {
		t.Errorf("Len = %d, want 5 (the Put before the outage, and the four kept in memory during it: three of new, one of cb)", a.store.Len())
	}

	srv.Restart()
	// go-redis dials again at its next call, or, after it gave up dialling, within a
	// second (its probe): wait for that, boundedly.
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		a.store.Put("back", Result{Body: finalResult("back"), Owner: alice})
		if _, ok := b.store.Get("back"); ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the store does not work 10 s after Redis restarted")
		}
		<-tick.C
	}
	if a.store.down.Load() {
		t.Errorf("the store is still down after Redis answered")
	}
	// An empty Redis: what A submitted before is A's own again, and new submissions are
	// shared as before.
	a.submit(t, "z")
	wantPoll(t, b.Bridge, "z", alice, Pending, InProgress("z"))
	wantPoll(t, b.Bridge, "x", alice, Miss, nil)
	wantPoll(t, a.Bridge, "x", alice, Pending, InProgress("x"))
	// What A kept in memory it still serves; Redis's own result wins once it has one.
	wantPoll(t, a.Bridge, "cb", alice, Stored, finalResult("cb"))
	wantPoll(t, b.Bridge, "cb", alice, Miss, nil)
	a.store.Put("new", Result{Body: infectedResult("new"), Owner: alice})
	if r, ok := a.store.Get("new"); !ok || !bytes.Equal(r.Body, infectedResult("new")) {
		t.Errorf("A's Get(new) after Redis took a result = %q, %v, want Redis's", r.Body, ok)
	}
}

// submit registers a new submission of dataID by alice through r.
func (r replica) submit(t *testing.T, dataID string) {
	t.Helper()
	_, secret, err := r.Callback()
	if err != nil {
		t.Fatal(err)
	}
	r.Submitted(dataID, secret, alice)
}

// silentRedis is a Redis that accepts connections, reads what is sent (counted in
// received, in bytes) and never answers: hung, or behind a network that drops. It stops
// at the test's end.
func silentRedis(t *testing.T) (addr string, received *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	received = new(atomic.Int64)
	var (
		mu    sync.Mutex
		conns []net.Conn
		wg    sync.WaitGroup
	)
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() {
				buf := make([]byte, 4096)
				for {
					n, err := c.Read(buf)
					received.Add(int64(n))
					if err != nil {
						return
					}
				}
			})
		}
	})
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String(), received
}

// commandCount is a go-redis hook that counts the commands its client is asked to
// send, each of a pipeline, before they are sent: a count that a call has raised once it
// returned, whether the command reached Redis or not.
type commandCount struct{ n atomic.Int64 }

func (c *commandCount) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *commandCount) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.n.Add(1)
		return next(ctx, cmd)
	}
}

func (c *commandCount) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.n.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}

// TestRedisTimeout: a Redis that accepts connections and never answers (hung, or a
// network that drops) holds each call for the timeout only: the client's own bounds
// are far above hangBound, so that only the store's timeout keeps a call within it.
func TestRedisTimeout(t *testing.T) {
	addr, _ := silentRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, MaxRetries: -1,
		ReadTimeout: 6 * hangBound, WriteTimeout: 6 * hangBound})
	t.Cleanup(func() { rdb.Close() })
	const timeout = 50 * time.Millisecond
	s, err := NewRedisStore(rdb, RedisStoreOptions{TTL: testTTL, PendingTTL: testPendingTTL, Timeout: timeout, MaxBytes: testMaxBytes})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	for i := range 2 {
		timed(t, "Get", func() {
			// Nothing the first time; then the result the first Put kept in memory.
			if _, ok := s.Get("a"); ok != (i > 0) {
				t.Errorf("Get(a) from a silent Redis: found %v, want %v", ok, i > 0)
			}
		})
		timed(t, "Lookup", func() { s.Lookup("a", alice) })
		timed(t, "Put", func() { s.Put("a", Result{Body: finalResult("a")}) })
		timed(t, "PutPending", func() { s.PutPending("a", PendingID{Owner: alice, Submitted: time.Now()}) })
		timed(t, "DropPending", func() { s.DropPending("a", alice) })
	}
}

// TestRedisStoreSkipsHungRedis: once Redis has not answered storeFailuresToOpen calls
// in a row, the store skips it (a poll then costs nothing of a hung Redis, rather than
// the timeout each: nothing more is sent to it), and it tries Redis again every
// storeRetryEvery: a Redis that answers again is used again.
func TestRedisStoreSkipsHungRedis(t *testing.T) {
	addr, _ := silentRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { rdb.Close() })
	var cmds commandCount // what the store asks the client to send, counted as it asks
	rdb.AddHook(&cmds)
	s, err := NewRedisStore(rdb, RedisStoreOptions{TTL: testTTL, PendingTTL: testPendingTTL, Timeout: 20 * time.Millisecond, MaxBytes: testMaxBytes})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	for range storeFailuresToOpen {
		s.Lookup("a", alice)
	}
	sent := cmds.n.Load()
	if sent == 0 {
		t.Fatal("the store sent the hung Redis nothing of the first calls")
	}
	start := time.Now()
	for range 10 { // 400 ms of timeouts if each reached Redis: within storeRetryEvery
		s.Lookup("a", alice)
		s.PutPending("a", PendingID{Owner: alice, Submitted: time.Now()})
	}
	if got := cmds.n.Load(); got != sent && time.Since(start) < storeRetryEvery {
		t.Errorf("the store sent the hung Redis %d commands more after %d calls it did not answer, want none: the store skips it", got-sent, storeFailuresToOpen)
	}

	// A Redis that answers again is used again, within storeRetryEvery or so.
	srv := redistest.Start(t)
	s2, err := NewRedisStore(srv.Client(t), RedisStoreOptions{TTL: testTTL, PendingTTL: testPendingTTL, Timeout: DefaultRedisTimeout, MaxBytes: testMaxBytes})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s2.Close)
	srv.Stop()
	for range storeFailuresToOpen + 1 {
		s2.Lookup("b", alice)
	}
	srv.Restart()
	other := newRedisStore(t, srv, "", testTimeout)
	other.Put("b", Result{Body: finalResult("b"), Owner: alice})
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, ok := s2.Get("b"); ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the store never used Redis again after it came back (30 s)")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestRedisReplicasConcurrent: submissions through A, polls through B and callbacks to
// A at once; every result ends up stored for B to serve.
func TestRedisReplicasConcurrent(t *testing.T) {
	srv := redistest.Start(t)
	clock := newFakeClock()
	a := newReplica(t, srv, clock, Options{})
	b := newReplica(t, srv, clock, Options{})
	const n = 32
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			id := "c" + strconv.Itoa(i)
			_, secret, err := a.Callback()
			if err != nil {
				t.Error(err)
				return
			}
			a.Submitted(id, secret, alice)
			if src := b.Poll(id, alice).Source; src != Pending {
				t.Errorf("B's Poll(%s) before the callback = %v, want pending", id, src)
			}
			// Not post: its t.Fatal must not run off the test's goroutine.
			resp, err := a.srv.Client().Post(a.srv.URL+CallbackPath+secret, "application/json", bytes.NewReader(finalResult(id)))
			if err != nil {
				t.Errorf("callback for %s: %v", id, err)
				return
			}
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Errorf("callback for %s = %d, want 200", id, resp.StatusCode)
			}
		})
		wg.Go(func() { b.Poll("c"+strconv.Itoa(i), alice) })
	}
	wg.Wait()
	for i := range n {
		id := "c" + strconv.Itoa(i)
		wantPoll(t, b.Bridge, id, alice, Stored, finalResult(id))
	}
}

// BenchmarkRedisPoll: a poll answered from a result in Redis (one round trip to a local
// redis-server), beside BenchmarkPollStored's memory.
func BenchmarkRedisPoll(b *testing.B) {
	srv := redistest.Start(b)
	s, err := NewRedisStore(srv.Client(b), RedisStoreOptions{TTL: testTTL, PendingTTL: testPendingTTL, Timeout: testTimeout, MaxBytes: testMaxBytes})
	if err != nil {
		b.Fatal(err)
	}
	br, err := New(Options{CallbackURL: "http://127.0.0.1:9010", Store: s})
	if err != nil {
		b.Fatal(err)
	}
	s.Put("x", Result{Body: finalResult("x"), ContentType: "application/json", Owner: alice})
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if br.Poll("x", alice).Source != Stored {
				b.Error("not stored")
				return
			}
		}
	})
}

// TestRedisRefusalLogClockStepBack: the lines about Redis refusing a call are sampled
// by their last instant on the wall clock; a clock stepped back (that instant an hour
// ahead) must not silence them until the clock catches up.
func TestRedisRefusalLogClockStepBack(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	ctx := context.Background()
	if err := rdb.Set(ctx, "text", "x", 0).Err(); err != nil {
		t.Fatal(err)
	}
	refusal := rdb.Incr(ctx, "text").Err() // Redis's own error reply
	if _, ok := refusal.(redis.Error); !ok {
		t.Fatalf("INCR of a text = %v, want an error reply of Redis", refusal)
	}
	var logs bytes.Buffer // done logs from this goroutine
	s := &RedisStore{log: slog.New(slog.NewJSONHandler(&logs, nil))}
	s.done(refusal)
	s.done(refusal) // within replyErrorLogEvery: sampled out
	s.lastReplyLog.Store(time.Now().Add(time.Hour).UnixNano())
	s.done(refusal)
	if n := strings.Count(logs.String(), "Redis refused a call"); n != 2 {
		t.Errorf("%d lines of Redis refusing, want 2: the first, and the first after the clock stepped back an hour", n)
	}
}
