package bridge

import (
	"runtime"
	"strconv"
	"testing"
	"time"
)

// heapGrowth returns how many bytes of heap f leaves live.
func heapGrowth(f func()) int64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f()
	runtime.GC()
	runtime.ReadMemStats(&after)
	return int64(after.HeapAlloc) - int64(before.HeapAlloc)
}

// TestIssuedBound: the secrets given out and not submitted yet are at most maxIssued,
// however many submissions never get Core's answer recorded, and weigh at most 192
// bytes each (the memory table of docs/operations.md).
func TestIssuedBound(t *testing.T) {
	tb := newTestBridge(t, Options{})
	grown := heapGrowth(func() {
		for range maxIssued + 100 {
			if _, _, err := tb.Callback(); err != nil {
				t.Fatal(err)
			}
		}
	})
	if n := len(tb.issued); n != maxIssued {
		t.Fatalf("%d secrets given out and not submitted are remembered, want maxIssued (%d)", n, maxIssued)
	}
	t.Logf("%d secrets remembered: heap grown by %d bytes, %d each", maxIssued, grown, grown/maxIssued)
	if grown > maxIssued*192 {
		t.Errorf("heap grew by %d bytes for %d secrets, want at most 192 each", grown, maxIssued)
	}
}

// TestRevokedBound: the ended sessions a store remembers are at most maxRevoked, and
// weigh at most 128 bytes each (the memory table of docs/operations.md).
func TestRevokedBound(t *testing.T) {
	var r revokedSet
	now := time.Now()
	grown := heapGrowth(func() {
		for i := range maxRevoked + 100 {
			r.add(OwnerOf(strconv.Itoa(i)), now.Add(time.Hour), now)
		}
	})
	if n := len(r.m); n != maxRevoked {
		t.Fatalf("%d ended sessions remembered, want maxRevoked (%d)", n, maxRevoked)
	}
	t.Logf("%d ended sessions remembered: heap grown by %d bytes, %d each", maxRevoked, grown, grown/maxRevoked)
	if grown > maxRevoked*128 {
		t.Errorf("heap grew by %d bytes for %d ended sessions, want at most 128 each", grown, maxRevoked)
	}
}
