package bridge

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"
)

var (
	alice = OwnerOf("alice-key")
	bob   = OwnerOf("bob-key")
)

func TestOwnerOf(t *testing.T) {
	if OwnerOf("a") == OwnerOf("b") {
		t.Errorf("OwnerOf(a) = OwnerOf(b), want them apart")
	}
	if OwnerOf("a") != OwnerOf("a") {
		t.Errorf("OwnerOf(a) differs between calls")
	}
	if OwnerOf("") == (Owner{}) {
		t.Errorf("OwnerOf(\"\") = the zero Owner, want the digest of the empty key")
	}
}

func TestNew(t *testing.T) {
	store, err := NewMemoryStore(1<<20, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	tests := []struct {
		name    string
		o       Options
		wantErr string
	}{
		{"defaults", Options{CallbackURL: "http://127.0.0.1:9010", Store: store}, ""},
		{"https with path", Options{CallbackURL: "https://mdproxy.local/bridge/", Store: store}, ""},
		{"no URL", Options{Store: store}, "http or https"},
		{"ftp", Options{CallbackURL: "ftp://host", Store: store}, "http or https"},
		{"no host", Options{CallbackURL: "http:///x", Store: store}, "no host"},
		{"query", Options{CallbackURL: "http://h/?a=b", Store: store}, "no query"},
		{"fragment", Options{CallbackURL: "http://h/#f", Store: store}, "no query"},
		{"bad URL", Options{CallbackURL: "http://h:port", Store: store}, "parsing"},
		{"no store", Options{CallbackURL: "http://h"}, "no result store"},
		{"negative refresh", Options{CallbackURL: "http://h", Store: store, Refresh: -1}, "negative"},
		{"negative pending TTL", Options{CallbackURL: "http://h", Store: store, PendingTTL: -1}, "negative"},
		{"negative cap", Options{CallbackURL: "http://h", Store: store, MaxCallbackBytes: -1}, "negative"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b, err := New(tc.o)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("New = %v, want no error", err)
				}
				if b.refresh != DefaultRefresh || b.pendingTTL != DefaultPendingTTL || b.maxBody != DefaultMaxCallbackBytes {
					t.Errorf("New: refresh %v, pending TTL %v, cap %d, want the defaults", b.refresh, b.pendingTTL, b.maxBody)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("New = %v, want an error containing %q", err, tc.wantErr)
			}
		})
	}
}

func TestCallback(t *testing.T) {
	for _, base := range []string{"http://127.0.0.1:9010", "http://127.0.0.1:9010/", "https://proxy.example/mdproxy"} {
		tb := newTestBridge(t, Options{CallbackURL: base})
		want := regexp.MustCompile("^" + regexp.QuoteMeta(strings.TrimSuffix(base, "/")) + "/callback/([0-9a-f]{64})$")
		seen := map[string]bool{}
		for range 100 {
			u, secret, err := tb.Callback()
			if err != nil {
				t.Fatalf("Callback() = %v, want no error", err)
			}
			m := want.FindStringSubmatch(u)
			if m == nil || m[1] != secret {
				t.Fatalf("Callback() = %q, %q, want %s with the secret", u, secret, want)
			}
			if seen[secret] {
				t.Fatalf("Callback() gave secret %s twice", secret)
			}
			seen[secret] = true
		}
	}
}

func TestSourceString(t *testing.T) {
	for s, want := range map[Source]string{Miss: "miss", Stored: "store", Pending: "pending", Overdue: "overdue", Source(9): "unknown"} {
		if got := s.String(); got != want {
			t.Errorf("Source(%d).String() = %q, want %q", int(s), got, want)
		}
	}
}

// wantPoll checks the answer to a poll of dataID by owner.
func wantPoll(t *testing.T, b *Bridge, dataID string, owner Owner, src Source, body []byte) {
	t.Helper()
	a := b.Poll(dataID, owner)
	if a.Source != src {
		t.Fatalf("Poll(%s) source = %v, want %v", dataID, a.Source, src)
	}
	if src == Miss {
		if a.Body != nil {
			t.Errorf("Poll(%s) = miss with a body %s, want none", dataID, a.Body)
		}
		return
	}
	if !bytes.Equal(a.Body, body) {
		t.Errorf("Poll(%s) body = %s, want %s", dataID, a.Body, body)
	}
	if a.ContentType == "" {
		t.Errorf("Poll(%s) has no content type", dataID)
	}
}

func TestPollSources(t *testing.T) {
	tb := newTestBridge(t, Options{})
	const id = "d1"
	wantPoll(t, tb.Bridge, id, alice, Miss, nil)
	tb.submit(t, id, alice)
	wantPoll(t, tb.Bridge, id, alice, Pending, InProgress(id))
	wantPoll(t, tb.Bridge, id, bob, Miss, nil)

	running := result(id, 40, 255)
	tb.Observe(id, alice, running, "application/json; charset=utf-8")
	wantPoll(t, tb.Bridge, id, alice, Pending, running)
	if a := tb.Poll(id, alice); a.ContentType != "application/json; charset=utf-8" {
		t.Errorf("Poll content type = %q, want Core's", a.ContentType)
	}

	final := finalResult(id)
	tb.Observe(id, alice, final, "application/json")
	wantPoll(t, tb.Bridge, id, alice, Stored, final)
	wantPoll(t, tb.Bridge, id, bob, Miss, nil)
	if n := tb.PendingLen(); n != 0 {
		t.Errorf("PendingLen() = %d after a final result, want 0", n)
	}
	if n := tb.store.Len(); n != 1 {
		t.Errorf("store.Len() = %d, want 1", n)
	}
}

func TestObserve(t *testing.T) {
	t.Run("final result of an unknown id is stored and copied", func(t *testing.T) {
		tb := newTestBridge(t, Options{})
		body := finalResult("u1")
		want := bytes.Clone(body)
		tb.Observe("u1", bob, body, "application/json")
		body[0] = 'X' // the caller's buffer may be reused
		wantPoll(t, tb.Bridge, "u1", bob, Stored, want)
		wantPoll(t, tb.Bridge, "u1", alice, Miss, nil)
	})
	t.Run("non-final reply is copied", func(t *testing.T) {
		tb := newTestBridge(t, Options{})
		tb.submit(t, "p1", alice)
		body := result("p1", 10, 255)
		want := bytes.Clone(body)
		tb.Observe("p1", alice, body, "application/json")
		body[0] = 'X'
		wantPoll(t, tb.Bridge, "p1", alice, Pending, want)
	})
	t.Run("non-final reply of an unknown id changes nothing", func(t *testing.T) {
		tb := newTestBridge(t, Options{})
		tb.Observe("u2", alice, result("u2", 10, 255), "application/json")
		wantPoll(t, tb.Bridge, "u2", alice, Miss, nil)
		if n := tb.PendingLen(); n != 0 {
			t.Errorf("PendingLen() = %d, want 0", n)
		}
	})
	t.Run("bodies that are no result are ignored", func(t *testing.T) {
		tb := newTestBridge(t, Options{})
		tb.submit(t, "p2", alice)
		for _, body := range []string{"", "<html>", "[]", `"x"`, `{"scan_results":{"progress_percentage":"100"}}`} {
			tb.Observe("p2", alice, []byte(body), "text/html")
			wantPoll(t, tb.Bridge, "p2", alice, Pending, InProgress("p2"))
		}
	})
	t.Run("another owner's replies do not touch the submitter's", func(t *testing.T) {
		tb := newTestBridge(t, Options{})
		tb.submit(t, "p3", alice)
		tb.Observe("p3", bob, result("p3", 50, 255), "application/json")
		wantPoll(t, tb.Bridge, "p3", alice, Pending, InProgress("p3"))
		// Core gave bob the final result: neither alice's place nor her answer changes.
		tb.Observe("p3", bob, infectedResult("p3"), "application/json")
		wantPoll(t, tb.Bridge, "p3", alice, Pending, InProgress("p3"))
		wantPoll(t, tb.Bridge, "p3", bob, Miss, nil)
		// alice's own final result is stored; bob's later one does not replace it.
		final := finalResult("p3")
		tb.Observe("p3", alice, final, "application/json")
		tb.Observe("p3", bob, infectedResult("p3"), "application/json")
		wantPoll(t, tb.Bridge, "p3", alice, Stored, final)
		wantPoll(t, tb.Bridge, "p3", bob, Miss, nil)
	})
}

func TestOverdue(t *testing.T) {
	const refresh = time.Minute
	t.Run("no callback for refresh while pending", func(t *testing.T) {
		tb := newTestBridge(t, Options{Refresh: refresh})
		tb.submit(t, "x", alice)
		steps := []struct {
			after time.Duration // since the previous step
			want  Source
		}{
			{0, Pending},
			{refresh - time.Second, Pending},
			{time.Second, Overdue}, // refresh old, no callback since
			{0, Pending},           // at most once per refresh
			{refresh - time.Nanosecond, Pending},
			{time.Nanosecond, Overdue},
			{time.Second, Pending},
		}
		for i, s := range steps {
			tb.clock.Add(s.after)
			if got := tb.Poll("x", alice).Source; got != s.want {
				t.Fatalf("step %d: Poll = %v, want %v", i, got, s.want)
			}
		}
		// Another owner is never told to ask Core on the submitter's behalf.
		if got := tb.Poll("x", bob).Source; got != Miss {
			t.Errorf("Poll by another owner = %v, want miss", got)
		}
	})
	t.Run("callbacks flowing hold the quiet rule back", func(t *testing.T) {
		tb := newTestBridge(t, Options{Refresh: refresh})
		srv := httptest.NewServer(tb.Handler())
		defer srv.Close()
		tb.submit(t, "x", alice)
		tb.clock.Add(50 * time.Second)
		ys := tb.submit(t, "y", alice) // 50 s after x: not more than refresh
		tb.clock.Add(5 * time.Second)
		if code := post(t, srv, ys, finalResult("y")); code != http.StatusOK {
			t.Fatalf("callback of y = %d, want 200", code)
		}
		tb.clock.Add(45 * time.Second) // x is 100 s old, the last callback 45 s ago
		if got := tb.Poll("x", alice).Source; got != Pending {
			t.Errorf("Poll(x) 45 s after a callback = %v, want pending", got)
		}
		tb.clock.Add(15 * time.Second) // 60 s since the last callback
		if got := tb.Poll("x", alice).Source; got != Overdue {
			t.Errorf("Poll(x) 60 s after the last callback = %v, want overdue", got)
		}
	})
	t.Run("a callback of a later submission", func(t *testing.T) {
		tb := newTestBridge(t, Options{Refresh: refresh})
		srv := httptest.NewServer(tb.Handler())
		defer srv.Close()
		tb.submit(t, "x", alice)
		tb.clock.Add(refresh - time.Second)
		early := tb.submit(t, "early", alice) // within refresh of x
		tb.clock.Add(2 * time.Second)
		late := tb.submit(t, "late", alice) // more than refresh after x
		if code := post(t, srv, early, finalResult("early")); code != http.StatusOK {
			t.Fatalf("callback of early = %d, want 200", code)
		}
		if got := tb.Poll("x", alice).Source; got != Pending {
			t.Errorf("Poll(x) after the callback of an id submitted %v after it = %v, want pending", refresh-time.Second, got)
		}
		tb.clock.Add(time.Second)
		if code := post(t, srv, late, finalResult("late")); code != http.StatusOK {
			t.Fatalf("callback of late = %d, want 200", code)
		}
		if got := tb.Poll("x", alice).Source; got != Overdue {
			t.Errorf("Poll(x) after the callback of an id submitted %v after it = %v, want overdue", refresh+time.Second, got)
		}
		if got := tb.Poll("x", alice).Source; got != Pending {
			t.Errorf("second Poll(x) = %v, want pending (at most once per refresh)", got)
		}
		// An id submitted after "late" is not overdue by the same token.
		tb.submit(t, "after", alice)
		if got := tb.Poll("after", alice).Source; got != Pending {
			t.Errorf("Poll(after) = %v, want pending", got)
		}
	})
	t.Run("forged and invalid callbacks do not count as arrived", func(t *testing.T) {
		tb := newTestBridge(t, Options{Refresh: refresh})
		srv := httptest.NewServer(tb.Handler())
		defer srv.Close()
		secret := tb.submit(t, "x", alice)
		tb.clock.Add(refresh - time.Second)
		post(t, srv, strings.Repeat("ab", 32), finalResult("x"))
		post(t, srv, secret, result("x", 50, 255))
		post(t, srv, secret, finalResult("other"))
		tb.clock.Add(time.Second)
		if got := tb.Poll("x", alice).Source; got != Overdue {
			t.Errorf("Poll(x) = %v, want overdue: only stored callbacks count", got)
		}
	})
	t.Run("the overdue answer carries the pending body", func(t *testing.T) {
		tb := newTestBridge(t, Options{Refresh: refresh})
		tb.submit(t, "x", alice)
		running := result("x", 70, 255)
		tb.Observe("x", alice, running, "application/json")
		tb.clock.Add(refresh)
		wantPoll(t, tb.Bridge, "x", alice, Overdue, running)
	})
}

func TestPendingTTL(t *testing.T) {
	const ttl = time.Hour
	tb := newTestBridge(t, Options{Refresh: time.Minute, PendingTTL: ttl})
	tb.submit(t, "old", alice)
	tb.submit(t, "unpolled", alice)
	tb.clock.Add(ttl)
	if got := tb.Poll("old", alice).Source; got == Miss {
		t.Fatalf("Poll(old) at exactly the pending TTL = miss, want it still pending")
	}
	tb.clock.Add(time.Nanosecond)
	wantPoll(t, tb.Bridge, "old", alice, Miss, nil)
	tb.submit(t, "new", alice)
	// The sweep of Submitted dropped the id nobody polled.
	if n := tb.PendingLen(); n != 1 {
		t.Errorf("PendingLen() = %d after the TTL, want 1 (new only)", n)
	}
	wantPoll(t, tb.Bridge, "unpolled", alice, Miss, nil)
	tb.clock.Add(ttl + time.Minute)
	if n := tb.PendingLen(); n != 0 {
		t.Errorf("PendingLen() = %d after the TTL, want 0", n)
	}
}

func TestSubmittedAgain(t *testing.T) {
	tb := newTestBridge(t, Options{})
	srv := httptest.NewServer(tb.Handler())
	defer srv.Close()
	old := tb.submit(t, "x", alice)
	tb.submit(t, "x", bob)
	if n := tb.PendingLen(); n != 1 {
		t.Errorf("PendingLen() = %d, want 1", n)
	}
	if code := post(t, srv, old, finalResult("x")); code != http.StatusNotFound {
		t.Errorf("callback on the replaced secret = %d, want 404", code)
	}
	wantPoll(t, tb.Bridge, "x", alice, Miss, nil)
	wantPoll(t, tb.Bridge, "x", bob, Pending, InProgress("x"))
}
