// Package bridge takes Core's callbacks for the submissions mdproxy forwards and answers
// the polls of their results from what it received, so that polling clients stop
// reaching Core (issue 11, ARCHITECTURE.md "The bridge").
//
// The proxy asks the bridge for a callback URL (Callback) to add to a submission that
// has none, records the data_id Core answered (Submitted), asks it how to answer each
// poll of GET /file/{data_id} (Poll) and shows it Core's answers (Observe). Core posts
// the final result to Handler, the callback listener. Results are kept in a Store, by
// data_id, with the submitter's Owner.
//
// Several replicas may share one Store (RedisStore, issue 12): each records its
// submissions there as well as in its own memory, so that a poll reaching another
// replica is answered as the submitting one would (the result once stored by whichever
// replica took Core's callback, the pending answer before, Core asked only when the
// callback looks overdue from the shared submission time). Callback secrets stay with the
// replica that gave them out: Core calls back the URL it was given.
//
// Security model: a callback is accepted only on the secret path made for its
// submission (at least 128 bits from crypto/rand, found by its SHA-256 and compared in
// constant time), with the data_id recorded for that secret, once, and only a final
// result; anything else changes nothing and is counted. A stored or pending result is
// answered only to the Owner (apikey digest) that submitted it; any other client is sent
// to Core, which decides access. A pending id is answered with Core's last reply for it
// or with InProgress, never with anything that reads as a verdict.
//
// The bridge runs no goroutine; it is safe for concurrent use.
package bridge

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"golang.org/x/sync/semaphore"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults of Options.
const (
	DefaultRefresh          = 60 * time.Second
	DefaultPendingTTL       = 24 * time.Hour
	DefaultMaxCallbackBytes = 64 << 20
	DefaultMaxPendingBytes  = 32 << 20
)

// CallbackPath is the path prefix of the callback listener: Core posts a result to
// CallbackPath + secret.
const CallbackPath = "/callback/"

// secretBytes is the size of a callback secret drawn from crypto/rand: 256 bits,
// rendered as 64 lower-case hex digits.
const secretBytes = 32

// issuedTTL is how long a secret Callback gave out waits for Submitted before it is
// forgotten, and maxIssued the most such secrets remembered. They serve only a callback
// that arrives before Core's answer to its submission was recorded (a small file scanned
// fast): Submitted works without them, so forgetting one costs nothing else.
const (
	issuedTTL = 10 * time.Minute
	maxIssued = 1 << 16
)

// jsonType is the Content-Type of the answers the bridge makes itself.
const jsonType = "application/json"

// Outcomes of a callback, the keys of Callbacks and the values of the outcome label of
// mdproxy_bridge_callbacks_total. The set is fixed.
const (
	// OutcomeStored: a final result on a live secret path with its data_id, stored (200).
	OutcomeStored = "stored"
	// OutcomeForged: a POST whose path is no live secret path (404): a wrong or unknown
	// secret, a replay after the result was stored, a late callback for an id whose
	// result a poll already brought home or that was dropped, or a path outside
	// /callback/. Also an early callback (see Handler) whose submission was never
	// recorded.
	OutcomeForged = "forged"
	// OutcomeInvalid: a request the listener refused for what it is rather than where it
	// went: another method than POST (405), or, on a live secret path, a body over
	// MaxCallbackBytes (413), not JSON, without the secret's data_id, or not final (400).
	OutcomeInvalid = "invalid"
	// OutcomeBusy: a callback on a live secret path refused with 503 and Retry-After
	// (Core delivers it again) because the callback bodies in memory, being read or
	// held early, would weigh more than MaxCallbackBytes in all.
	OutcomeBusy = "busy"
)

// Options configure a Bridge. The zero value of each field but CallbackURL and Store
// takes its default.
type Options struct {
	// CallbackURL is the base URL at which Core reaches the callback listener, e.g.
	// http://127.0.0.1:9010 (MDPROXY_BRIDGE_CALLBACK_URL): http or https, a host, an
	// optional path, no query or fragment. Required.
	CallbackURL string
	// Store keeps the final results. Required.
	Store Store
	// Refresh is how long a pending id's callback may be late before Core is asked
	// about it, and the shortest interval between two such questions for one id
	// (MDPROXY_BRIDGE_REFRESH). Zero: DefaultRefresh, 60 s.
	Refresh time.Duration
	// PendingTTL is how long an id stays pending without its result; then it is
	// dropped and its polls go to Core (MDPROXY_BRIDGE_PENDING_TTL). Zero:
	// DefaultPendingTTL, 24 h, Core's default retention.
	PendingTTL time.Duration
	// MaxCallbackBytes caps the body of a callback, in bytes; a larger one is refused
	// (413). It also caps the callback bodies in memory at once, being read or held
	// early (see Handler), beyond which a callback is refused as busy (503). Zero:
	// DefaultMaxCallbackBytes, 64 MiB.
	MaxCallbackBytes int64
	// MaxPendingBytes caps, in bytes, what the pending ids hold, all together: this
	// replica's submissions and the other replicas' ids that polls here met
	// (MDPROXY_BRIDGE_PENDING_MAX_BYTES). Each weighs its data_id and 512 bytes (its
	// records, measured at 287 to 452), plus Core's reply (not final) it holds as its
	// answer (see Observe): that reply's body and Content-Type and 64 bytes. A new
	// pending id that would pass the cap drops the oldest ones (counted, see
	// PendingDropped), whose polls then go to Core as an expired one's do (with a
	// shared store, which still holds the id, they are answered as another replica's
	// submission); a reply that would pass it is not kept. Zero:
	// DefaultMaxPendingBytes, 32 MiB (61,000 ids of 32 bytes without replies).
	MaxPendingBytes int64
	// Now is the clock. Nil: time.Now.
	Now func() time.Time
	// Logger receives the listener's refusals (debug) and odd events (warn). Nil:
	// discard.
	Logger *slog.Logger
}

// Bridge tracks pending submissions and answers polls from the callbacks received. It
// is safe for concurrent use and runs no goroutine. Create it with New.
type Bridge struct {
	base       string // CallbackURL without a trailing slash
	basePath   string // its path, without a trailing slash: "" or "/a/b"
	store      Store
	refresh    time.Duration
	pendingTTL time.Duration
	maxBody    int64
	now        func() time.Time
	log        *slog.Logger

	mu  sync.Mutex
	ids pendingIDs // the pending ids, own and shared, within MaxPendingBytes
	// lastCallback is when the last callback was stored; zero: none yet.
	lastCallback time.Time
	// missedCallback is when Core last answered a question about a pending id with its
	// final result, its callback not come: the evidence that callbacks are lost.
	missedCallback time.Time
	// newestCalledBack is the latest submission time among the ids whose callback was
	// stored; zero: none yet.
	newestCalledBack time.Time
	// issued holds the secrets Callback gave out and Submitted did not take yet, by
	// their SHA-256, for issuedTTL, and the early callback bodies they hold (each
	// holding its bytes of bodies).
	issued          map[[32]byte]*issuedEntry
	lastIssuedSweep time.Time

	stored, forged, invalid, busy atomic.Uint64
	// drops counts the pending entries dropped (dropLocked), a result's among them once
	// it is stored: Poll looks in the store again when one was dropped during its own
	// look-up, which may have missed the result by a moment.
	drops atomic.Uint64
	// overflows counts the pending entries dropped over MaxPendingBytes (addLocked).
	overflows atomic.Uint64
	// bodies bounds the callback bodies in memory to maxBody bytes in all: each
	// callback takes its Content-Length (maxBody when unknown) while it is read, and an
	// early one keeps its body's length until it is stored or forgotten.
	bodies *semaphore.Weighted
}

// issuedEntry is a secret given out by Callback whose submission is not recorded yet:
// 64 bytes, and a slot of Bridge.issued, for each of up to maxIssued.
type issuedEntry struct {
	secret [32]byte // SHA-256 of the secret
	at     time.Time
	// early is the final result posted on the secret before Submitted; nil while none.
	early *earlyCallback
}

// earlyCallback is a callback held until its submission is recorded (see Handler).
type earlyCallback struct {
	body        []byte
	dataID      string
	contentType string
	at          time.Time
}

// earlyBody returns the body of ie's early callback; nil while none.
func (ie *issuedEntry) earlyBody() []byte {
	if ie.early == nil {
		return nil
	}
	return ie.early.body
}

// New returns a Bridge with o's settings. It returns an error if o.CallbackURL is not an
// absolute http or https URL without query or fragment, if o.Store is nil, or if a
// duration or size is negative.
func New(o Options) (*Bridge, error) {
	u, err := url.Parse(o.CallbackURL)
	switch {
	case err != nil:
		return nil, fmt.Errorf("bridge: parsing the callback URL: %w", err)
	case u.Scheme != "http" && u.Scheme != "https":
		return nil, fmt.Errorf("bridge: the callback URL %q must be http or https", o.CallbackURL)
	case u.Host == "":
		return nil, fmt.Errorf("bridge: the callback URL %q has no host", o.CallbackURL)
	case u.RawQuery != "" || u.Fragment != "" || u.ForceQuery:
		return nil, fmt.Errorf("bridge: the callback URL %q must have no query or fragment", o.CallbackURL)
	case o.Store == nil:
		return nil, errors.New("bridge: no result store")
	case o.Refresh < 0:
		return nil, fmt.Errorf("bridge: the refresh interval %v is negative", o.Refresh)
	case o.PendingTTL < 0:
		return nil, fmt.Errorf("bridge: the pending time to live %v is negative", o.PendingTTL)
	case o.MaxCallbackBytes < 0:
		return nil, fmt.Errorf("bridge: the callback body cap %d is negative", o.MaxCallbackBytes)
	case o.MaxPendingBytes < 0:
		return nil, fmt.Errorf("bridge: the pending ids' cap %d is negative", o.MaxPendingBytes)
	}
	b := &Bridge{
		base:       strings.TrimRight(o.CallbackURL, "/"),
		basePath:   strings.TrimRight(u.Path, "/"),
		store:      o.Store,
		refresh:    cmpOr(o.Refresh, DefaultRefresh),
		pendingTTL: cmpOr(o.PendingTTL, DefaultPendingTTL),
		maxBody:    cmpOr(o.MaxCallbackBytes, DefaultMaxCallbackBytes),
		bodies:     semaphore.NewWeighted(cmpOr(o.MaxCallbackBytes, DefaultMaxCallbackBytes)),
		now:        o.Now,
		log:        o.Logger,
		issued:     map[[32]byte]*issuedEntry{},
		ids: pendingIDs{
			own:      map[string]*pendingEntry{},
			bySecret: map[[32]byte]*pendingEntry{},
			shared:   map[string]*pendingEntry{},
			max:      cmpOr(o.MaxPendingBytes, DefaultMaxPendingBytes),
		},
	}
	if b.now == nil {
		b.now = time.Now
	}
	if b.log == nil {
		b.log = slog.New(slog.DiscardHandler)
	}
	return b, nil
}

// cmpOr returns v, or def when v is zero.
func cmpOr[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// Callback returns the callbackurl to give Core for a new submission, CallbackURL +
// "/callback/" + secret, with secret 256 bits from crypto/rand in lower-case hex. Pass
// secret to Submitted once Core answered the submission's data_id. The error, from
// crypto/rand, does not happen on the systems Go supports.
func (b *Bridge) Callback() (callbackURL, secret string, err error) {
	var buf [secretBytes]byte
	if _, err := rand.Read(buf[:]); err != nil {
		return "", "", fmt.Errorf("bridge: drawing a callback secret: %w", err)
	}
	secret = hex.EncodeToString(buf[:])
	h := sha256.Sum256([]byte(secret))
	now := b.now()
	b.mu.Lock()
	b.sweepIssuedLocked(now)
	if len(b.issued) < maxIssued {
		b.issued[h] = &issuedEntry{secret: h, at: now}
	}
	b.mu.Unlock()
	return b.base + CallbackPath + secret, secret, nil
}

// sweepIssuedLocked forgets the secrets given out more than issuedTTL ago and not
// submitted, at most once a minute; an early callback one of them held is counted
// forged, as no submission of ours asked for it. b.mu must be held.
func (b *Bridge) sweepIssuedLocked(now time.Time) {
	if !b.lastIssuedSweep.IsZero() && now.Sub(b.lastIssuedSweep) < time.Minute {
		return
	}
	b.lastIssuedSweep = now
	for h, ie := range b.issued {
		if now.Sub(ie.at) > issuedTTL {
			b.forgetIssuedLocked(h, ie)
			if ie.early != nil {
				b.forged.Add(1)
			}
		}
	}
}

// forgetIssuedLocked removes ie, issued under h. b.mu must be held.
func (b *Bridge) forgetIssuedLocked(h [32]byte, ie *issuedEntry) {
	delete(b.issued, h)
	if n := int64(len(ie.earlyBody())); n > 0 {
		b.bodies.Release(n)
	}
}

// Submitted records dataID as pending: submitted by owner with secret (as Callback
// returned it), now. A dataID already pending is replaced, its old secret no longer
// accepted. If Core's callback for secret came first (see Handler) and names dataID, its
// result is stored for owner at once instead. When the pending ids would then weigh
// more than MaxPendingBytes, the oldest are dropped.
//
// The store is told first (Store.PutPending, which a shared store bounds by its
// timeout), before the id is pending here: a callback that comes meanwhile is held as an
// early one, so that the result it stores always comes after the store's pending id and
// ends it.
func (b *Bridge) Submitted(dataID, secret string, owner Owner) {
	now := b.now()
	h := sha256.Sum256([]byte(secret))
	b.store.PutPending(dataID, PendingID{Owner: owner, Submitted: now})
	b.mu.Lock()
	if old := b.ids.own[dataID]; old != nil {
		b.dropLocked(old)
	}
	if ie := b.issued[h]; ie != nil {
		b.forgetIssuedLocked(h, ie)
		if early := ie.early; early != nil {
			if early.dataID == dataID {
				b.calledBackLocked(early.at, now)
				b.mu.Unlock()
				b.store.Put(dataID, Result{Body: early.body, ContentType: early.contentType, Owner: owner})
				b.stored.Add(1)
				return
			}
			b.invalid.Add(1) // then wait for the result as if no callback came
			b.log.Warn("bridge: an early callback named another data_id than Core's answer to its submission")
		}
	}
	defer b.mu.Unlock()
	if old := b.ids.bySecret[h]; old != nil {
		b.dropLocked(old) // a secret given twice: only the last submission keeps it
	}
	b.sweepLocked(now)
	e := &pendingEntry{dataID: dataID, secret: h, owner: owner, submitted: now}
	b.ids.own[dataID] = e
	b.ids.bySecret[h] = e
	b.addLocked(e, now)
}

// Source says where the answer to a poll comes from.
type Source int

const (
	Miss    Source = iota // not known here (or another owner's): forward to Core under the route's limit
	Stored                // a final result of owner's: answer Body, Core not asked, no token
	Pending               // pending and not overdue: answer Body (the last reply Core gave for it, or InProgress)
	Overdue               // pending, its callback looks overdue: ask Core (under the route's limit); if the limit refuses, answer Body (as Pending)
)

// String returns the metric label value of s: "miss", "store", "pending" or "overdue"
// ("unknown" for a value outside these).
func (s Source) String() string {
	switch s {
	case Miss:
		return "miss"
	case Stored:
		return "store"
	case Pending:
		return "pending"
	case Overdue:
		return "overdue"
	}
	return "unknown"
}

// Answer is how to answer a poll. Body and ContentType are set for every Source but
// Miss; Body is shared and must not be modified.
type Answer struct {
	Source      Source
	Body        []byte
	ContentType string
	// Release, when not nil, gives back the answer budget's bytes that Body holds (a
	// result read from Redis, see RedisStore.Lookup): call it once Body is written.
	Release func()
}

// Poll decides how a poll of dataID by owner is answered. A pending id of another owner,
// or a stored result of another owner, is a Miss (Core decides access). While callbacks
// arrive, Overdue is returned at most once per Refresh per id (the next polls within
// Refresh get Pending), and only when its callback looks overdue: a callback has arrived
// for an id submitted more than Refresh after it, or none has arrived for Refresh since
// the id was submitted. Once Core has answered such a question with a final result whose
// callback never came, and until a callback is stored again, the callback path looks
// broken (Core cannot reach the listener): every poll of a pending id is Overdue, so that
// results come home as fast as the route's limit lets them, never slower than without
// the bridge. A pending id older than PendingTTL is dropped (Miss), as is one dropped
// to keep the pending ids within MaxPendingBytes.
//
// Only callbacks that were stored count as arrived, so forged ones cannot hold back the
// questions to Core. A stored hit takes no lock of the bridge. A stored result whose
// copy the answer budget cannot hold now (Entry.Withheld, a RedisStore's) is Overdue,
// with InProgress as the answer should the route's limit refuse the question; a stored
// answer read into a copy carries the Release the caller must call once it is written.
//
// With a shared store, an id another replica submitted and the store holds pending is
// answered here as there: Pending (InProgress, or Core's last reply to a poll here), and
// Overdue by the same rules from the shared submission time, with this replica's own
// record of callbacks and questions (each replica asks Core at most once per Refresh per
// id). The store is asked once a poll (Store.Lookup); when it cannot answer, only this
// replica's own submissions are known. When it answers without one of this replica's
// own pending ids (Redis lost it), the id is recorded there again.
func (b *Bridge) Poll(dataID string, owner Owner) Answer {
	drops := b.drops.Load()
	se := b.store.Lookup(dataID, owner)
	if se.Revoked {
		return Answer{Source: Miss} // a session ended: Core decides (403)
	}
	if se.Stored && se.Result.Owner == owner {
		return storedAnswer(dataID, se)
	}
	a, lost := b.pollLocked(dataID, owner, se)
	if a.Source == Miss && b.drops.Load() != drops {
		// A result is stored before its pending entry is dropped (a callback, Observe):
		// a look-up just before the one and the pending entries just after the other
		// find neither, and the submitter's poll would go to Core and its limit (503).
		// A pending entry dropped since the look-up: look again.
		if se := b.store.Lookup(dataID, owner); se.Stored && !se.Revoked && se.Result.Owner == owner {
			return storedAnswer(dataID, se)
		}
	}
	if lost != nil {
		// The shared store answered without this replica's own pending id: Redis lost
		// it (restarted empty, flushed, or evicted it under maxmemory), and the polls
		// of the other replicas would go to Core and its limit. Recorded again.
		b.store.PutPending(dataID, *lost)
	}
	return a
}

// storedAnswer is the answer to the owner's poll of its stored result se: the result,
// or, when the answer budget could not hold a copy of it now (se.Withheld), Overdue
// with the in-progress answer: Core is asked under the route's limit, its answer
// relayed as it comes when the budget still cannot hold it, and a poll the limit
// refuses gets the in-progress answer (the client polls again), never a 503.
func storedAnswer(dataID string, se Entry) Answer {
	if se.Withheld {
		return Answer{Source: Overdue, Body: InProgress(dataID), ContentType: jsonType}
	}
	return Answer{Source: Stored, Body: se.Result.Body, ContentType: se.Result.ContentType, Release: se.Release}
}

// pollLocked is Poll once the store answered se: the answer, and this replica's own
// pending id when the store keeps pending ids, answered, and has lost it (nil
// otherwise). It takes b.mu.
func (b *Bridge) pollLocked(dataID string, owner Owner, se Entry) (a Answer, lost *PendingID) {
	now := b.now()
	b.mu.Lock()
	defer b.mu.Unlock()
	e := b.entryLocked(dataID, se, now)
	if e == nil || e.owner != owner {
		return Answer{Source: Miss}, nil
	}
	if now.Sub(e.submitted) > b.pendingTTL {
		b.dropLocked(e)
		return Answer{Source: Miss}, nil
	}
	if se.Checked && !se.IsPending && !se.Stored && !e.shared {
		lost = &PendingID{Owner: e.owner, Submitted: e.submitted}
	}
	a = Answer{Source: Pending}
	a.Body, a.ContentType = e.answer()
	if b.callbacksLostLocked() {
		// No callback comes at all: every poll asks Core, within the route's limit, as
		// without the bridge but never answered with the limit's 503.
		a.Source = Overdue
		return a, lost
	}
	if b.overdueLocked(e, now) && (e.asked.IsZero() || now.Sub(e.asked) >= b.refresh) {
		e.asked = now
		a.Source = Overdue
	}
	return a, lost
}

// callbacksLostLocked reports whether the callback path looks broken: since the last
// callback was stored, Core answered a question about an overdue id with the id's final
// result, its callback never come (Core cannot reach the listener, or lost its webhook
// settings). Silence alone is no evidence: one slow scan is silent too. A callback stored
// ends it. b.mu must be held.
func (b *Bridge) callbacksLostLocked() bool {
	return b.missedCallback.After(b.lastCallback)
}

// overdueLocked reports whether e's callback looks overdue at now: a callback was
// stored for an id submitted more than refresh after e, or no callback was stored for
// refresh while e was pending (now - max(last callback, e's submission) >= refresh).
// b.mu must be held.
func (b *Bridge) overdueLocked(e *pendingEntry, now time.Time) bool {
	if b.newestCalledBack.Sub(e.submitted) > b.refresh {
		return true
	}
	quietSince := e.submitted
	if b.lastCallback.After(quietSince) {
		quietSince = b.lastCallback
	}
	return now.Sub(quietSince) >= b.refresh
}

// Observe records Core's 200 answer to a poll of dataID by owner: a final result (IsFinal)
// is stored and its pending entry dropped; otherwise the body becomes the pending id's
// last reply (only for a pending id of that owner).
//
// A final result is stored with owner as its Owner, unless the id is pending for another
// owner or a result of another owner is stored for it: then nothing changes, so that a
// client polling an id it did not submit (Core let it) cannot take the submitter's place.
// A body that is not a JSON object in Core's result format, or whose data_id is not
// dataID (compared exactly, as a callback's is), is ignored. body is copied.
//
// With a shared store, an id pending there for another owner is kept for it as one
// pending here. Only a final result for one of this replica's own submissions counts as
// a callback missed (see Poll): another replica's callbacks are its own business.
func (b *Bridge) Observe(dataID string, owner Owner, body []byte, contentType string) {
	r, err := parseResult(body)
	if err != nil || r.DataID == nil || *r.DataID != dataID {
		// Not about dataID (a Core node or a cache in front of it that answered for
		// another id): neither its result nor its progress, as a callback naming
		// another id is refused.
		return
	}
	if r.final() {
		se := b.store.Lookup(dataID, owner)
		if se.Release != nil {
			se.Release() // only whose result it is counts here
		}
		if se.Revoked {
			return
		}
		b.mu.Lock()
		e := b.entryLocked(dataID, se, b.now())
		b.mu.Unlock()
		if e != nil && e.owner != owner {
			return // the submitter's callback is still to come: keep its place
		}
		if se.Stored && se.Result.Owner != owner {
			return // do not take the submitter's result from it
		}
		// Stored before the pending entry goes, so that a poll meanwhile finds one; the
		// store's pending id goes with the Put.
		b.store.Put(dataID, Result{Body: bytes.Clone(body), ContentType: contentType, Owner: owner})
		if e != nil {
			b.mu.Lock()
			if !e.shared && b.ids.own[dataID] == e {
				b.missedCallback = b.now() // a final result, and no callback for it
			}
			b.dropLocked(e)
			b.mu.Unlock()
		}
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if e := b.knownLocked(dataID); e != nil && e.owner == owner {
		b.setReplyLocked(e, body, contentType)
	}
}

// NotAsked records that a poll of dataID by owner that Poll answered Overdue did not
// reach Core after all: the route's limit refused it, its client left first, or Core's
// connection failed. The id stays overdue, so that the next poll asks again, rather than
// waiting Refresh for a question that was never answered. Safe for concurrent use.
func (b *Bridge) NotAsked(dataID string, owner Owner) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if e := b.knownLocked(dataID); e != nil && e.owner == owner {
		e.asked = time.Time{}
	}
}

// LoggedOut records that Core ended owner's session (it answered the owner's POST
// /logout with 200): from then on no stored result or pending answer is given to that
// owner's polls, which go to Core and are answered as Core answers a session it ended
// (403), for the store's time to live and on every replica sharing the store. Clients
// without an apikey (one owner, OwnerOf("")) have no session to end: nothing changes.
func (b *Bridge) LoggedOut(owner Owner) {
	if owner == OwnerOf("") {
		return
	}
	b.store.Revoke(owner)
}

// CallbackPrefix returns what every callback URL of this bridge starts with, its secret
// following: CallbackURL + CallbackPath. The proxy redacts the secrets that follow it in
// Core's answers (GET /file/webhook/{data_id} shows the callback URL): whoever reads a
// secret could post a result in Core's place.
func (b *Bridge) CallbackPrefix() string { return b.base + CallbackPath }

// Gone records that Core answered a poll of dataID by owner with 404: Core no longer has
// the scan (it restarted, or its retention passed), so no callback will come. A pending
// id of that owner is forgotten, and its next polls go to Core, which answers them as it
// did; waiting for a callback until PendingTTL would answer "in progress" for a day.
// A shared store forgets it too (Store.DropPending), so that the other replicas' polls
// go to Core as well; a replica that submitted it keeps its own record until Core
// answers its own question with 404. Safe for concurrent use.
func (b *Bridge) Gone(dataID string, owner Owner) {
	b.mu.Lock()
	e := b.knownLocked(dataID)
	known := e != nil && e.owner == owner
	if known {
		b.dropLocked(e)
	}
	b.mu.Unlock()
	if known {
		b.store.DropPending(dataID, owner)
	}
}

// Callbacks returns the number of callbacks received since New, by outcome: a key for
// each outcome (OutcomeStored, OutcomeForged, OutcomeInvalid, OutcomeBusy), always all
// of them.
// The counts only grow.
func (b *Bridge) Callbacks() map[string]float64 {
	return map[string]float64{
		OutcomeStored:  float64(b.stored.Load()),
		OutcomeForged:  float64(b.forged.Load()),
		OutcomeInvalid: float64(b.invalid.Load()),
		OutcomeBusy:    float64(b.busy.Load()),
	}
}
