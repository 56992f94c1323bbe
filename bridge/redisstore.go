package bridge

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sony/gobreaker/v2"
)

// Defaults of NewRedisStore.
const (
	// DefaultRedisPrefix starts every key of a RedisStore (MDPROXY_REDIS_PREFIX's
	// default).
	DefaultRedisPrefix = "mdproxy:"
	// DefaultRedisTimeout bounds each call of a RedisStore to Redis
	// (MDPROXY_REDIS_TIMEOUT's default).
	DefaultRedisTimeout = 50 * time.Millisecond
)

// putBuckets is the number of time buckets in which a RedisStore counts the results it
// put over its time to live (Len, Bytes): the counts are exact to a bucket's width,
// ttl/putBuckets.
const putBuckets = 64

// storeFailuresToOpen calls of a RedisStore in a row that Redis does not answer make it
// skip Redis, and storeRetryEvery later one call tries it again (as the limiter's
// breaker does, limiter.RedisOptions).
const (
	storeFailuresToOpen = 3
	storeRetryEvery     = time.Second
)

// replyErrorLogEvery is the least interval between two log lines about errors Redis
// answered (it is up, but refuses: out of memory with noeviction, a key of another type).
const replyErrorLogEvery = time.Minute

// RedisStore is a Store in Redis, shared by every mdproxy replica that uses the same
// Redis and key prefix (issue 12): a result stored through the replica that took Core's
// callback is served by any, and an id submitted through one is pending for all. Safe
// for concurrent use. It runs no goroutine until Redis fails to take a result (see Put);
// the Redis client is the caller's.
//
// Keys, for a data_id ID and the prefix P (default "mdproxy:"):
//
//   - P result:{ID}, a hash: body (Core's bytes), type (its Content-Type) and owner (the
//     hex SHA-256 of the submitter's apikey, never the key itself), expiring the store's
//     ttl after it was put;
//   - P pending:{ID}, a hash: owner (as above) and submitted (Unix time in
//     milliseconds), expiring the pending time to live after it was put.
//
// The braces make both keys of an ID one hash slot, so that a call touching both is one
// transaction on Redis Cluster too (a prefix holding braces breaks that there).
//
// Get, Lookup, Put, PutPending and DropPending each make one round trip to Redis (a
// command, a MULTI/EXEC pipeline or a script; a script unknown to a restarted Redis
// costs one more), bounded by the store's timeout; Len and Bytes make none.
// When Redis does not answer in time or refuses, PutPending and DropPending change
// nothing, and nothing reaches a client as an error. A result Put cannot write to Redis
// is kept in this replica's memory instead (a MemoryStore of the same size and time to
// live, made at the first such Put): the callback that brought it was answered 200, and
// Core does not send it again. Get and Lookup answer from that memory when Redis holds
// no result for the id or does not answer, so that the replica that took the callback
// serves the result, as it would without Redis; the other replicas do not see it (their
// polls of the id go to Core once its callback looks overdue). A change between Redis
// answering and not is logged once (warn, then info), never once per call.
//
// Size: MDPROXY_STORE_MAX_BYTES cannot bound Redis, which other replicas and
// applications fill too. The cap is Redis's own: maxmemory with maxmemory-policy
// volatile-lru (every key here expires, so every one may be evicted, the least recently
// read first) or allkeys-lru; not volatile-ttl, which would evict the limiter's
// short-lived keys first (deploy/ sets volatile-lru). With noeviction, a full Redis
// refuses Put, whose result is then kept in this replica's memory, and PutPending,
// which keeps nothing. The rule that a result weighing
// more than maxBytes/16 is not kept stays. Len and Bytes count what this replica put in
// the last ttl (see Len), not what Redis holds: counting the keys of a prefix in Redis
// takes a SCAN of every key.
//
// A result Lookup reads for its owner's poll is a copy the poll holds while its client
// reads it: its bytes are taken from an answer budget (RedisStoreOptions.Answers) before
// it is read, and a copy the budget cannot take is not read (Entry.Withheld).
//
// Redis is trusted as the memory of the process is: whoever can write to it can change
// the results served.
//
// Close stops the goroutines of the memory that holds what Redis did not take, if any.
type RedisStore struct {
	rdb        redis.UniversalClient
	prefix     string
	ttl        time.Duration
	pendingTTL time.Duration
	timeout    time.Duration
	maxBytes   int64
	maxEntry   int64   // a result weighing more is not kept
	answers    *Budget // the bodies Lookup reads are charged to it
	log        *slog.Logger
	now        func() time.Time // for Len and Bytes

	// local holds the results Put could not write to Redis; nil until the first.
	local   atomic.Pointer[MemoryStore]
	localMu sync.Mutex // held while local is made, and by Close
	closed  bool       // Close was called: local is closed as soon as it is made

	// cb skips Redis while it does not answer (storeFailuresToOpen calls in a row),
	// trying one call again every storeRetryEvery: a hung Redis costs a poll nothing
	// then, rather than the timeout each.
	cb *gobreaker.TwoStepCircuitBreaker[struct{}]
	// revoked keeps this replica's own marks of ended sessions (Revoke), so that they
	// hold while Redis does not answer, and are written to Redis again when it lost
	// them or never took them.
	revoked      revokedSet
	down         atomic.Bool  // the last call failed without an answer of Redis
	failures     atomic.Int64 // calls that failed, since the start
	lastReplyLog atomic.Int64 // Unix nanoseconds of the last log line about a refusal

	mu    sync.Mutex
	puts  []putBucket // results put, oldest first, one bucket per ttl/putBuckets
	n     int         // entries in puts
	bytes int64       // weight in puts
}

// putBucket counts the results a RedisStore put from start for ttl/putBuckets.
type putBucket struct {
	start time.Time
	n     int
	bytes int64
}

var _ Store = (*RedisStore)(nil)

// putPendingScript records a pending id (KEYS[2]) unless a result (KEYS[1]) is stored:
// a callback that was stored first must not be followed by an id pending for a day.
// ARGV: owner (hex), submitted (Unix ms), time to live (ms).
var putPendingScript = redis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[2], 'owner', ARGV[1], 'submitted', ARGV[2])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
return 1`)

// lookupScript reads what Redis holds for an id in one round trip: the result's owner
// (KEYS[1]), its type and body only when that owner is ARGV[1] (hex), ARGV[1]'s
// session was not ended (KEYS[3]) and the body is at most ARGV[2] bytes, the pending id
// (KEYS[2]), whether the session was ended, and the body's length when that owner is
// ARGV[1]. It returns {owner or false, type or false, body or false, pending hash as
// field, value, ..., 1 if ended else 0, body length or 0}. Its keys are of different
// hash slots: one Redis, not a cluster (mdproxy makes a redis.Client).
var lookupScript = redis.NewScript(`
local owner = redis.call('HGET', KEYS[1], 'owner')
local revoked = redis.call('EXISTS', KEYS[3])
local typ, body, size = false, false, 0
if owner == ARGV[1] and revoked == 0 then
  size = redis.call('HSTRLEN', KEYS[1], 'body')
  if size <= tonumber(ARGV[2]) then
    typ = redis.call('HGET', KEYS[1], 'type')
    body = redis.call('HGET', KEYS[1], 'body')
  end
end
return {owner, typ, body, redis.call('HGETALL', KEYS[2]), revoked, size}`)

// dropPendingScript deletes a pending id (KEYS[1]) if its owner is ARGV[1] (hex).
var dropPendingScript = redis.NewScript(`
if redis.call('HGET', KEYS[1], 'owner') == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0`)

// RedisStoreOptions configure NewRedisStore. The zero value of Prefix, Timeout,
// Answers and Logger takes its default; TTL, PendingTTL and MaxBytes are required.
type RedisStoreOptions struct {
	// Prefix starts every key (MDPROXY_REDIS_PREFIX). "": DefaultRedisPrefix.
	Prefix string
	// TTL is how long a result is kept after it was put (MDPROXY_STORE_TTL).
	TTL time.Duration
	// PendingTTL is how long a pending id is kept after it was submitted (the bridge's
	// PendingTTL, MDPROXY_BRIDGE_PENDING_TTL).
	PendingTTL time.Duration
	// Timeout bounds each call to Redis (MDPROXY_REDIS_TIMEOUT). Zero:
	// DefaultRedisTimeout, 50 ms.
	Timeout time.Duration
	// MaxBytes is the store's size in bytes (MDPROXY_STORE_MAX_BYTES): a result weighing
	// more than MaxBytes/16 is not kept, and the memory that keeps the results Redis did
	// not take (see Put) holds at most MaxBytes. Redis itself is bounded by its
	// maxmemory (see RedisStore).
	MaxBytes int64
	// Answers is the budget that the body of a result read from Redis for a poll is
	// charged to, from before it is read until the poll has written it (see Lookup):
	// mdproxy shares one with the proxy's answers from Core. nil: one of the store's
	// own, of DefaultAnswerBytes.
	Answers *Budget
	// Logger receives a line when Redis stops or starts answering. nil: discard.
	Logger *slog.Logger
}

// NewRedisStore returns a Store in Redis through rdb with o's settings.
//
// rdb must bound its calls by their context's deadline: a *redis.Client or
// *redis.ClusterClient must have ContextTimeoutEnabled set (otherwise its socket reads
// wait its ReadTimeout, 3 s by default, whatever o.Timeout says). NewRedisStore does not
// reach Redis: it may be down at the start. It returns an error if rdb is nil or lacks
// ContextTimeoutEnabled, if o.TTL, o.PendingTTL or o.MaxBytes is not positive, or if
// o.Timeout is negative.
func NewRedisStore(rdb redis.UniversalClient, o RedisStoreOptions) (*RedisStore, error) {
	switch {
	case rdb == nil:
		return nil, errors.New("bridge: no Redis client for the result store")
	case !contextTimeoutEnabled(rdb):
		return nil, errors.New("bridge: the Redis client must have ContextTimeoutEnabled set, so that a call ends at its deadline")
	case o.TTL <= 0:
		return nil, errors.New("bridge: the store's time to live must be positive")
	case o.PendingTTL <= 0:
		return nil, errors.New("bridge: the pending time to live must be positive")
	case o.MaxBytes <= 0:
		return nil, errors.New("bridge: the store's maximum size must be positive")
	case o.Timeout < 0:
		return nil, fmt.Errorf("bridge: the Redis timeout %v is negative", o.Timeout)
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Answers == nil {
		o.Answers = NewBudget(DefaultAnswerBytes)
	}
	return &RedisStore{
		cb: gobreaker.NewTwoStepCircuitBreaker[struct{}](gobreaker.Settings{
			Name:        "redis-store",
			MaxRequests: 1,
			Timeout:     storeRetryEvery,
			ReadyToTrip: func(c gobreaker.Counts) bool { return c.ConsecutiveFailures >= storeFailuresToOpen },
		}),
		rdb:        rdb,
		prefix:     cmpOr(o.Prefix, DefaultRedisPrefix),
		ttl:        o.TTL,
		pendingTTL: o.PendingTTL,
		timeout:    cmpOr(o.Timeout, DefaultRedisTimeout),
		maxBytes:   o.MaxBytes,
		maxEntry:   o.MaxBytes / 16,
		answers:    o.Answers,
		log:        o.Logger,
		now:        time.Now,
	}, nil
}

// contextTimeoutEnabled reports whether rdb ends a call at its context's deadline, as
// far as its type tells.
func contextTimeoutEnabled(rdb redis.UniversalClient) bool {
	switch c := rdb.(type) {
	case *redis.Client:
		return c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		return c.Options().ContextTimeoutEnabled
	}
	return true // another implementation: the caller's word
}

// resultKey and pendingKey are the keys of dataID's result and pending id.
func (s *RedisStore) resultKey(dataID string) string  { return s.prefix + "result:{" + dataID + "}" }
func (s *RedisStore) pendingKey(dataID string) string { return s.prefix + "pending:{" + dataID + "}" }

// revokedKey is the key that says owner's session was ended (Revoke).
func (s *RedisStore) revokedKey(owner Owner) string {
	return s.prefix + "revoked:" + hex.EncodeToString(owner[:])
}

// Revoke records that owner's session ended, for the store's time to live: in this
// replica's memory, and in Redis, so that every replica's look-ups of its results say
// Revoked. When Redis does not take it (down, slow), it is written again at a look-up
// of owner's once Redis answers.
func (s *RedisStore) Revoke(owner Owner) {
	now := s.now()
	until := now.Add(s.ttl)
	s.revoked.add(owner, until, now)
	s.putRevoked(owner, until)
}

// putRevoked writes owner's mark in Redis until until; it reports whether Redis took it.
func (s *RedisStore) putRevoked(owner Owner, until time.Time) bool {
	ctx, done, ok := s.call()
	err := errSkipped
	if ok {
		err = s.rdb.Set(ctx, s.revokedKey(owner), "1", time.Until(until)).Err()
	}
	return done(err)
}

// errSkipped is the error of a call not made: Redis did not answer the calls before it
// (the breaker is open).
var errSkipped = errors.New("Redis skipped: it did not answer the calls before")

// call returns the context of one call to Redis, the store's timeout from now, and the
// function to pass the call's error to (done); ok is false when Redis is skipped (the
// breaker is open): the caller then passes errSkipped to done without calling Redis.
func (s *RedisStore) call() (ctx context.Context, done func(error) bool, ok bool) {
	settle, err := s.cb.Allow()
	if err != nil {
		return nil, func(error) bool { return s.done(errSkipped) }, false
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
	return ctx, func(err error) bool {
		cancel()
		ok := s.done(err)
		if _, refused := errors.AsType[redis.Error](err); ok || refused {
			settle(nil) // Redis answered: it is up
		} else {
			settle(err)
		}
		return ok
	}, true
}

// done records how a call to Redis ended and reports whether it succeeded: a failure is
// counted, and a change between Redis answering and not is logged once.
func (s *RedisStore) done(err error) bool {
	if err == nil || errors.Is(err, redis.Nil) {
		if s.down.CompareAndSwap(true, false) {
			s.log.Info("bridge: Redis answers again: results and pending ids are shared")
		}
		return true
	}
	s.failures.Add(1)
	if _, ok := errors.AsType[redis.Error](err); ok {
		// Redis answered, and refused: it is up. Logged at most once a replyErrorLogEvery.
		// A last line "in the future" means the clock stepped back: logged, rather than
		// silenced until the clock catches up.
		now := time.Now().UnixNano()
		last := s.lastReplyLog.Load()
		if since := now - last; (since < 0 || since >= int64(replyErrorLogEvery)) && s.lastReplyLog.CompareAndSwap(last, now) {
			s.log.Warn("bridge: Redis refused a call of the result store", "err", err)
		}
		return false
	}
	if s.down.CompareAndSwap(false, true) && err != errSkipped {
		s.log.Warn("bridge: Redis does not answer: results and pending ids are not shared (results called back meanwhile are kept in this replica's memory), polls that miss go to Core", "err", err.Error(), "timeout", s.timeout.String())
	}
	return false
}

// Get returns the result kept for dataID: Redis's, or else the one this replica kept in
// its memory because Redis did not take it (see Put); a miss when neither holds one.
func (s *RedisStore) Get(dataID string) (Result, bool) {
	ctx, done, ok := s.call()
	var m map[string]string
	err := errSkipped
	if ok {
		m, err = s.rdb.HGetAll(ctx, s.resultKey(dataID)).Result()
	}
	if done(err) {
		if r, ok := decodeResult(m); ok {
			return r, true
		}
	}
	return s.localGet(dataID)
}

// inlineBody is the most bytes of a result's body that Lookup reads in its first call
// to Redis, taken from the answer budget before the call: a larger body takes a second
// call, once the budget took its length. Core's results are a few KiB (an archive's
// with many files, more).
const inlineBody = 64 << 10

// Lookup returns the result and the pending id kept for dataID, read in one round trip
// (lookupScript), the result's body and type only when its owner is owner; when Redis
// holds no result for it or does not answer within the timeout, the result this
// replica kept in its memory, if any (see Put).
//
// A body read from Redis is a copy that the poll holds while its client reads it: its
// bytes are taken from the answer budget (RedisStoreOptions.Answers) before Redis is
// asked for it, up to inlineBody in the first call and, for a larger body, its length
// before a second call, and given back by the Entry's Release. When the budget cannot
// take them, the body is not read: the Entry says Withheld, without a body. So slow
// clients reading results from Redis hold at most the budget, however many they are.
func (s *RedisStore) Lookup(dataID string, owner Owner) Entry {
	pre := int64(min(inlineBody, s.maxEntry))
	if !s.answers.TryAcquire(pre) {
		pre = 0
	}
	e, size, copied := s.lookup(dataID, owner, pre)
	if size > pre {
		// The owner's body is larger than what was taken for it: its own length, then a
		// second call (the result may have changed between the two: a body larger
		// still is withheld).
		s.answers.Release(pre)
		pre = 0
		if size <= s.maxEntry && s.answers.TryAcquire(size) {
			pre = size
			e, size, copied = s.lookup(dataID, owner, pre)
		}
		e.Withheld = size > pre && e.Stored
	}
	n := int64(0)
	if copied {
		n = int64(len(e.Result.Body))
		e.Release = s.releaser(n)
	}
	s.answers.Release(pre - n)
	return e
}

// releaser returns the Release of an Entry whose body holds n bytes of the answer
// budget: it gives them back once, whatever the number of calls; nil when n is 0.
func (s *RedisStore) releaser(n int64) func() {
	if n == 0 {
		return nil
	}
	var once sync.Once
	return func() { once.Do(func() { s.answers.Release(n) }) }
}

// lookup is one call of Lookup: the entry, with the result's body when it is owner's
// and at most limit bytes; the body's length when the result in Redis is owner's (0
// when it is not, or Redis did not answer), a body over limit not read but its result
// named stored; and whether the entry's body is a copy read from Redis (rather than
// none, or the memory's own).
func (s *RedisStore) lookup(dataID string, owner Owner, limit int64) (e Entry, size int64, copied bool) {
	until, revoked := s.revoked.until(owner, s.now)
	ctx, done, ok := s.call()
	var reply []any
	err := errSkipped
	if ok {
		var v any
		v, err = lookupScript.Run(ctx, s.rdb, []string{s.resultKey(dataID), s.pendingKey(dataID), s.revokedKey(owner)},
			hex.EncodeToString(owner[:]), limit).Result()
		if reply, ok = v.([]any); err == nil && (!ok || len(reply) != 6) {
			err = fmt.Errorf("bridge: Redis's answer to a look-up has the wrong shape: %T", v)
		}
	}
	if done(err) {
		if n, _ := reply[4].(int64); n == 1 {
			return Entry{Revoked: true, Checked: true}, 0, false
		}
		if revoked {
			// This replica saw the logout, and Redis does not hold it: written again,
			// for the other replicas.
			s.putRevoked(owner, until)
			return Entry{Revoked: true, Checked: true}, 0, false
		}
		size, _ = reply[5].(int64)
		if size > limit {
			// owner's result, its body not read: named stored, without a body.
			o, _ := reply[0].(string)
			var r Result
			r.Owner, e.Stored = decodeOwner(o)
			e.Result = r
		} else {
			e.Result, e.Stored = decodeLookup(reply, owner)
			copied = e.Stored && e.Result.Owner == owner
		}
		pend, _ := reply[3].([]any)
		m := make(map[string]string, len(pend)/2)
		for i := 0; i+1 < len(pend); i += 2 {
			k, _ := pend[i].(string)
			v, _ := pend[i+1].(string)
			m[k] = v
		}
		e.Pending, e.IsPending = decodePending(m)
		e.Checked = true
	}
	if revoked {
		return Entry{Revoked: true}, 0, false // Redis did not answer: this replica's mark holds
	}
	if !e.Stored {
		if r, ok := s.localGet(dataID); ok {
			if r.Owner != owner {
				r = Result{Owner: r.Owner}
			}
			e.Result, e.Stored = r, true
		}
	}
	return e, size, copied
}

// decodeLookup reads the result part of lookupScript's reply for a poll of asker:
// stored when it names an owner of 32 bytes in hex, with its type and body when that
// owner is asker (none stored if the body did not come then: a hash without one).
func decodeLookup(reply []any, asker Owner) (Result, bool) {
	o, _ := reply[0].(string)
	owner, ok := decodeOwner(o)
	if !ok {
		return Result{}, false
	}
	r := Result{Owner: owner}
	if owner == asker {
		body, ok := reply[2].(string)
		if !ok {
			return Result{}, false
		}
		r.Body = []byte(body)
		r.ContentType, _ = reply[1].(string)
	}
	return r, true
}

// localGet returns the result kept in this replica's memory for dataID, if any: one
// atomic load when Redis took every result.
func (s *RedisStore) localGet(dataID string) (Result, bool) {
	if l := s.local.Load(); l != nil {
		return l.Get(dataID)
	}
	return Result{}, false
}

// Put keeps r for dataID for the store's time to live, unless it weighs more than a
// sixteenth of maxBytes, and deletes dataID's pending id, in one transaction. When Redis
// does not answer within the timeout or refuses (a full Redis with noeviction), r is
// kept in this replica's memory instead, for the same time to live and within
// maxBytes, and the pending id stays in Redis (its other replicas then ask Core about
// it once its callback looks overdue).
func (s *RedisStore) Put(dataID string, r Result) {
	w := int64(weightOf(dataID, r))
	keep := w <= s.maxEntry
	ctx, done, ok := s.call()
	err := errSkipped
	if ok {
		_, err = s.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.Del(ctx, s.pendingKey(dataID))
			if keep {
				key := s.resultKey(dataID)
				p.HSet(ctx, key, "body", r.Body, "type", r.ContentType, "owner", hex.EncodeToString(r.Owner[:]))
				p.PExpire(ctx, key, s.ttl)
			}
			return nil
		})
	}
	ok = done(err) // Redis's state is recorded for every call
	if !keep {
		return
	}
	if !ok {
		l, lerr := s.localStore()
		if lerr != nil {
			s.log.Error("bridge: a result Redis did not take is lost", "err", lerr.Error())
			return
		}
		l.Put(dataID, r)
	}
	s.count(w)
}

// localStore returns the memory that keeps the results Redis did not take, made at the
// first call.
func (s *RedisStore) localStore() (*MemoryStore, error) {
	if l := s.local.Load(); l != nil {
		return l, nil
	}
	s.localMu.Lock()
	defer s.localMu.Unlock()
	if l := s.local.Load(); l != nil {
		return l, nil
	}
	l, err := NewMemoryStore(s.maxBytes, s.ttl)
	if err != nil {
		return nil, err
	}
	if s.closed {
		l.Close()
	}
	s.local.Store(l)
	return l, nil
}

// Close stops the goroutines of the memory that keeps the results Redis did not take
// (see Put), if it was made; the store still answers afterwards. It does not close the
// Redis client, which is the caller's. Close may be called more than once.
func (s *RedisStore) Close() {
	s.localMu.Lock()
	defer s.localMu.Unlock()
	s.closed = true
	if l := s.local.Load(); l != nil {
		l.Close()
	}
}

// PutPending records p for dataID for the pending time to live, unless a result is
// stored for dataID. Nothing changes when Redis does not answer within the timeout.
func (s *RedisStore) PutPending(dataID string, p PendingID) {
	ctx, done, ok := s.call()
	err := errSkipped
	if ok {
		err = putPendingScript.Run(ctx, s.rdb,
			[]string{s.resultKey(dataID), s.pendingKey(dataID)},
			hex.EncodeToString(p.Owner[:]), p.Submitted.UnixMilli(), s.pendingTTL.Milliseconds()).Err()
	}
	done(err)
}

// DropPending deletes dataID's pending id if owner submitted it. Nothing changes when
// Redis does not answer within the timeout.
func (s *RedisStore) DropPending(dataID string, owner Owner) {
	ctx, done, ok := s.call()
	err := errSkipped
	if ok {
		err = dropPendingScript.Run(ctx, s.rdb, []string{s.pendingKey(dataID)}, hex.EncodeToString(owner[:])).Err()
	}
	done(err)
}

// decodeResult reads a result hash; a hash without an owner of 32 bytes in hex is none.
func decodeResult(m map[string]string) (Result, bool) {
	body, ok := m["body"]
	if !ok {
		return Result{}, false
	}
	owner, ok := decodeOwner(m["owner"])
	if !ok {
		return Result{}, false
	}
	return Result{Body: []byte(body), ContentType: m["type"], Owner: owner}, true
}

// decodePending reads a pending hash; one without an owner or a submission time is none.
func decodePending(m map[string]string) (PendingID, bool) {
	owner, ok := decodeOwner(m["owner"])
	if !ok {
		return PendingID{}, false
	}
	ms, err := strconv.ParseInt(m["submitted"], 10, 64)
	if err != nil {
		return PendingID{}, false
	}
	return PendingID{Owner: owner, Submitted: time.UnixMilli(ms)}, true
}

// decodeOwner parses 64 hex digits into an Owner.
func decodeOwner(s string) (Owner, bool) {
	var o Owner
	if len(s) != 2*len(o) {
		return o, false
	}
	_, err := hex.Decode(o[:], []byte(s))
	return o, err == nil
}

// count adds a result of weight w that this replica put now to Len and Bytes.
func (s *RedisStore) count(w int64) {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expireLocked(now)
	if k := len(s.puts); k == 0 || now.Sub(s.puts[k-1].start) >= s.ttl/putBuckets {
		s.puts = append(s.puts, putBucket{start: now})
	}
	b := &s.puts[len(s.puts)-1]
	b.n++
	b.bytes += w
	s.n++
	s.bytes += w
}

// expireLocked drops the buckets whose first result expired by now. s.mu must be held.
func (s *RedisStore) expireLocked(now time.Time) {
	i := 0
	for i < len(s.puts) && now.Sub(s.puts[i].start) >= s.ttl {
		s.n -= s.puts[i].n
		s.bytes -= s.puts[i].bytes
		i++
	}
	s.puts = s.puts[i:]
}

// Len returns the number of results this replica put in Redis in the last ttl (to
// within ttl/64): an estimate of its share of the store, which counts a replaced result
// twice and does not see what Redis evicted, nor what other replicas put. Asking Redis
// for the number of keys of a prefix would take a SCAN of all of them.
func (s *RedisStore) Len() int {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expireLocked(now)
	return s.n
}

// Bytes returns the weight of the results counted by Len, in bytes (body, key, content
// type and a fixed overhead each, as a MemoryStore weighs them), not Redis's memory.
func (s *RedisStore) Bytes() int64 {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expireLocked(now)
	return s.bytes
}
