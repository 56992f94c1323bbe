package bridge

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/maypok86/otter/v2"
)

// Owner identifies who submitted a file: the SHA-256 of its apikey header, OwnerOf("")
// (the digest of the empty string, not the zero Owner) for a request without one.
// Keeping the digest rather than the key means that neither the bridge's memory nor a
// store holds a client's apikey.
type Owner [32]byte

// OwnerOf returns the Owner of a request whose apikey header is apikey ("" for none).
func OwnerOf(apikey string) Owner {
	return sha256.Sum256([]byte(apikey))
}

// Result is a final result as Core answered it, kept byte for byte: Body is the JSON of
// GET /file/{data_id} (or of a callback), ContentType Core's Content-Type header, and
// Owner the client the result may be served to. Body is shared once put in a Store: no
// one may modify it afterwards.
type Result struct {
	Body        []byte
	ContentType string
	Owner       Owner
}

// PendingID is a submission awaiting Core's callback as a shared Store keeps it, so that
// every replica knows it: its submitter's Owner and when it was submitted, by the clock
// of the replica that took the submission (replicas' clocks are assumed to agree within
// far less than Options.Refresh).
type PendingID struct {
	Owner     Owner
	Submitted time.Time
}

// Entry is what a Store holds for a data_id (Lookup): a final result when Stored, and
// a pending submission when IsPending. Should both be set, the result wins.
type Entry struct {
	Result    Result
	Stored    bool
	Pending   PendingID
	IsPending bool
	// Checked: the store keeps pending ids and answered, so that IsPending false means
	// it holds none for the id (a RedisStore that Redis answered); false for a
	// MemoryStore, which keeps none.
	Checked bool
	// Revoked: the asking owner's session was ended (Revoke): nothing kept may be
	// answered to it any more; Core decides.
	Revoked bool
	// Withheld: a result of the asking owner is stored (Stored), and its body was not
	// read because the answer budget could not take it now (RedisStore's Lookup): the
	// Result has its Owner and no body.
	Withheld bool
	// Release gives back the bytes of Result.Body taken from the answer budget while
	// the look-up's caller holds the body (a copy read from Redis); call it once the
	// body is no longer used. Nil when nothing was taken (no body, or the memory's own).
	// Safe to call more than once.
	Release func()
}

// Store holds final results by data_id and, when several replicas share it, the ids
// they submitted that await Core's callback. Safe for concurrent use. MemoryStore keeps
// results in the process and no pending ids (its Bridge keeps its own); RedisStore
// keeps both in Redis, shared by every replica that uses the same Redis and prefix.
//
// Get returns the result put for dataID, unless it expired or was evicted. Put keeps r
// for dataID, replacing any earlier result, and ends dataID's pending id if the store
// keeps one (also when it declines r); a store may decline to keep r (too large, or
// unreachable), so a Put never promises a later Get. Lookup returns in one call what
// the store holds for dataID, result and pending id, as they were at one instant; the
// result's body and content type only when its owner is owner (the poll's), so that a
// poll of another client, whose answer Core decides, costs no copy of a result that may
// weigh megabytes; a copy made for the owner's poll holds bytes of an answer budget
// until the Entry's Release (see Entry.Withheld).
// PutPending records p for dataID, for the store's pending time to live, unless a
// result is stored for it; DropPending forgets dataID's pending id if owner submitted
// it; a store that shares nothing does nothing there. Revoke records that owner's
// session was ended (Core answered its POST /logout), for the store's time to live: its
// look-ups say Revoked from then on, on every replica sharing the store. A store that cannot answer
// (unreachable) answers as if it held nothing: never an error, so that a poll is then
// forwarded to Core as any miss. Len is the number of entries and Bytes the bytes held
// (bodies and keys, roughly, with a per-entry overhead), as far as the store can tell
// cheaply (see each implementation).
type Store interface {
	Get(dataID string) (Result, bool)
	Put(dataID string, r Result)
	Lookup(dataID string, owner Owner) Entry
	Revoke(owner Owner)
	PutPending(dataID string, p PendingID)
	DropPending(dataID string, owner Owner)
	Len() int     // entries
	Bytes() int64 // bytes held (bodies and keys, roughly)
}

// entryOverhead is the weight added to each entry of a MemoryStore for what is not its
// body, key or content type: otter's node and hash table slot, the Result and the slice
// and string headers, in bytes. Measured at about 175 (TestMemoryStoreCap logs it); 256
// leaves a margin so that the heap the store holds stays under its cap.
const entryOverhead = 256

// MemoryStore is a Store in the process's memory, bounded in bytes, whose entries
// expire a fixed time after they were put. It is built on github.com/maypok86/otter/v2
// (W-TinyLFU eviction by weight, expiry after write). Safe for concurrent use.
//
// Its clock is coarse (otter.CoarseClock): read by a goroutine once per
// coarseResolution(ttl), a hundredth of the time to live between 1 ms and 1 s,
// rather than at every Get. An entry may so expire up to that much early or late. Reading
// the precise clock at every Get made it about 40% dearer (BenchmarkMemoryStoreGet),
// on the path that answers a poll from the store.
//
// otter runs a goroutine that removes expired entries every second, and the clock its
// own; Close stops both. A MemoryStore that is no longer referenced stops them by
// itself at their next tick, so Close is needed only where goroutines are counted
// (tests with goleak) or at shutdown.
type MemoryStore struct {
	c        *otter.Cache[string, Result]
	clock    *otter.CoarseClock // nil with a test's clock
	now      func() time.Time   // otter's clock, for the revoked owners
	ttl      time.Duration
	maxEntry int64 // a result weighing more is not kept

	revoked revokedSet // the owners whose session ended (Revoke)
}

// maxRevoked bounds the owners a store remembers as revoked in memory: each is a logout
// through mdproxy within the store's time to live; beyond, the one that expires first
// is forgotten (its session's results answered again until they expire).
const maxRevoked = 100_000

// revokedSet is a bounded set of owners whose session ended, each until a time. Safe
// for concurrent use; has takes no lock while the set is empty.
type revokedSet struct {
	mu sync.Mutex
	m  map[Owner]time.Time
	n  atomic.Int32
}

// add records owner until until, at now.
func (r *revokedSet) add(owner Owner, until, now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil {
		r.m = map[Owner]time.Time{}
	}
	if len(r.m) >= maxRevoked {
		var first Owner
		var at time.Time
		for o, u := range r.m {
			if !u.After(now) {
				delete(r.m, o)
			} else if at.IsZero() || u.Before(at) {
				first, at = o, u
			}
		}
		if len(r.m) >= maxRevoked {
			delete(r.m, first)
		}
	}
	r.m[owner] = until
	r.n.Store(int32(len(r.m)))
}

// until returns when owner's mark ends, and whether it holds now (the clock is read
// only when the set holds a mark: a store hit reads none).
func (r *revokedSet) until(owner Owner, now func() time.Time) (time.Time, bool) {
	if r.n.Load() == 0 {
		return time.Time{}, false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	u, ok := r.m[owner]
	return u, ok && u.After(now())
}

var _ Store = (*MemoryStore)(nil)

// NewMemoryStore returns a Store bounded to maxBytes (a result larger than maxBytes/16 is
// not kept) whose entries expire ttl after they were put; built on
// github.com/maypok86/otter/v2 v2.4.0 (weight = len(body)+len(dataID)+overhead; expiry after
// write). Call Close when done with it. It returns an error if maxBytes or ttl is not
// positive.
func NewMemoryStore(maxBytes int64, ttl time.Duration) (*MemoryStore, error) {
	return newMemoryStore(maxBytes, ttl, nil)
}

// newMemoryStore is NewMemoryStore with otter's clock: nil for a coarse real one, a fake
// one in tests.
func newMemoryStore(maxBytes int64, ttl time.Duration, clock otter.Clock) (*MemoryStore, error) {
	if maxBytes <= 0 {
		return nil, errors.New("bridge: the store's maximum size must be positive")
	}
	if ttl <= 0 {
		return nil, errors.New("bridge: the store's time to live must be positive")
	}
	var coarse *otter.CoarseClock
	if clock == nil {
		coarse = otter.NewCoarseClock(coarseResolution(ttl))
		clock = coarse
	}
	c, err := otter.New(&otter.Options[string, Result]{
		MaximumWeight:    uint64(maxBytes),
		Weigher:          func(dataID string, r Result) uint32 { return weightOf(dataID, r) },
		ExpiryCalculator: otter.ExpiryWriting[string, Result](ttl),
		Clock:            clock,
	})
	if err != nil {
		if coarse != nil {
			coarse.Stop()
		}
		return nil, fmt.Errorf("bridge: creating the result store: %w", err)
	}
	nowNano := clock.NowNano
	return &MemoryStore{c: c, clock: coarse, now: func() time.Time { return time.Unix(0, nowNano()) }, ttl: ttl, maxEntry: maxBytes / 16}, nil
}

// coarseResolution is how often a MemoryStore with a time to live of ttl reads the
// clock: a hundredth of ttl, from a millisecond up to a second (the default 24 h, like
// any ttl from 100 s up, gets a second).
func coarseResolution(ttl time.Duration) time.Duration {
	return min(max(ttl/100, time.Millisecond), time.Second)
}

// weightOf is the weight of an entry in bytes, capped at otter's uint32.
func weightOf(dataID string, r Result) uint32 {
	w := int64(len(r.Body)) + int64(len(dataID)) + int64(len(r.ContentType)) + entryOverhead
	return uint32(min(w, math.MaxUint32))
}

// Get returns the result kept for dataID, if any and not expired.
func (s *MemoryStore) Get(dataID string) (Result, bool) {
	// A quiet read: no access recorded for the eviction policy. A recorded read now and
	// then starts otter's buffer maintenance on the reading goroutine's account, which
	// made a poll answered from the store costlier than a limit answer; and a result's
	// polls say little about its worth (its owner reads it a few times, then never), so
	// eviction by the order results came in loses nothing.
	e, ok := s.c.GetEntryQuietly(dataID)
	return e.Value, ok
}

// Put keeps r for dataID for the store's time to live, unless it weighs more than a
// sixteenth of the store's maximum size; then nothing changes. r.Body must not be
// modified afterwards.
func (s *MemoryStore) Put(dataID string, r Result) {
	if int64(weightOf(dataID, r)) > s.maxEntry {
		return
	}
	s.c.Set(dataID, r)
}

// Lookup returns the result kept for dataID, as Get; a MemoryStore keeps no pending
// ids.
func (s *MemoryStore) Lookup(dataID string, owner Owner) Entry {
	if s.isRevoked(owner) {
		return Entry{Revoked: true}
	}
	r, ok := s.Get(dataID)
	if ok && r.Owner != owner {
		r = Result{Owner: r.Owner}
	}
	return Entry{Result: r, Stored: ok}
}

// Revoke records that owner's session ended, for the store's time to live.
func (s *MemoryStore) Revoke(owner Owner) {
	now := s.now()
	s.revoked.add(owner, now.Add(s.ttl), now)
}

// isRevoked reports whether owner's session was ended within the time to live.
func (s *MemoryStore) isRevoked(owner Owner) bool {
	_, ok := s.revoked.until(owner, s.now)
	return ok
}

// PutPending does nothing: a MemoryStore serves one Bridge, which keeps its pending ids
// itself.
func (s *MemoryStore) PutPending(string, PendingID) {}

// DropPending does nothing: a MemoryStore keeps no pending ids.
func (s *MemoryStore) DropPending(string, Owner) {}

// Len returns the number of entries (an estimate while otter's maintenance catches up).
func (s *MemoryStore) Len() int { return s.c.EstimatedSize() }

// Bytes returns the weight of the entries, in bytes: bodies, keys, content types and a
// fixed overhead each, as of otter's last maintenance, which follows writes closely but
// not at once.
func (s *MemoryStore) Bytes() int64 { return int64(s.c.WeightedSize()) }

// Close stops otter's clean-up goroutine and the clock's. The store still answers
// afterwards, reading the precise clock, but expired entries are removed only when met.
// Close may be called more than once.
func (s *MemoryStore) Close() {
	s.c.StopAllGoroutines()
	if s.clock != nil {
		s.clock.Stop()
	}
}
