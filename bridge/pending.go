package bridge

import (
	"bytes"
	"container/list"
	"time"
)

// pendingOverhead is the weight of a pending id beside its data_id, in bytes: its
// pendingEntry, its element of the list in submission order, and its slots in the maps
// by data_id and by the secret's digest. Measured at 287 to 346 bytes in maps that only
// grew, and up to 452 once ids were dropped and added many times over, the maps keeping
// room for those deleted (TestPendingBound logs it); 512 leaves a margin, so that the
// heap the pending ids take stays under their bound.
const pendingOverhead = 512

// replyOverhead is the weight of one of Core's replies held as a pending id's answer
// beside its body and Content-Type, in bytes: its pendingReply and the rounding of its
// allocations.
const replyOverhead = 64

// overflowQuiet is how long a burst of pending ids dropped over MaxPendingBytes lasts
// after its last drop: the first drop of a burst is logged, the others of the burst are
// only counted.
const overflowQuiet = time.Minute

// pendingIDs is the table of the ids whose result has not arrived, guarded by
// Bridge.mu: this replica's submissions and, with a shared store, the ids another
// replica submitted that polls here met. Every entry weighs its data_id, a fixed
// overhead and Core's reply it holds (weight); their sum stays at most max, the oldest
// entries dropped first.
type pendingIDs struct {
	own      map[string]*pendingEntry   // this replica's submissions, by data_id
	bySecret map[[32]byte]*pendingEntry // the same entries, by the SHA-256 of their secret
	// shared holds, by data_id, the ids another replica submitted (the store's pending
	// ids) that polls here met: what this replica asked and learnt of them. The store's
	// word decides whether one is still pending; always empty with a MemoryStore.
	shared map[string]*pendingEntry
	// order holds every entry, own and shared, in the order they were recorded here,
	// the oldest at the front: dropping the oldest, or any one, is O(1).
	order list.List
	bytes int64 // the weight of the entries held, at most max
	max   int64 // Options.MaxPendingBytes
	// lastSweep is when entries older than the pending time to live were last dropped.
	lastSweep time.Time
	// lastOverflow is when an entry was last dropped over max; zero: never.
	lastOverflow time.Time
}

// pendingEntry is a submission whose final result has not arrived.
type pendingEntry struct {
	dataID    string
	secret    [32]byte // SHA-256 of the callback secret
	owner     Owner
	submitted time.Time
	// reply is Core's last 200 reply (not final) for the id, the answer to its polls;
	// nil: none yet, answered with InProgress.
	reply *pendingReply
	// asked is when Poll last answered Overdue; zero: never.
	asked time.Time
	// shared: another replica's submission, known from the store (no secret here).
	shared bool
	// elem is the entry's element of pendingIDs.order; nil once dropped.
	elem *list.Element
}

// pendingReply is one of Core's replies held as a pending id's answer.
type pendingReply struct {
	body        []byte
	contentType string
}

// weight returns what e counts against MaxPendingBytes, in bytes.
func (e *pendingEntry) weight() int64 {
	w := pendingOverhead + int64(len(e.dataID))
	if e.reply != nil {
		w += replyWeight(e.reply.body, e.reply.contentType)
	}
	return w
}

// replyWeight returns what a reply of body and contentType held as a pending answer
// counts against MaxPendingBytes, in bytes.
func replyWeight(body []byte, contentType string) int64 {
	return replyOverhead + int64(len(body)) + int64(len(contentType))
}

// answer returns the answer to a poll of e's id: Core's last reply, or the in-progress
// answer, made at each call rather than held for every id.
func (e *pendingEntry) answer() (body []byte, contentType string) {
	if e.reply != nil {
		return e.reply.body, e.reply.contentType
	}
	return InProgress(e.dataID), jsonType
}

// addLocked records e, whose maps already hold it, as the newest entry, then drops the
// oldest entries, e itself last, until the entries weigh at most MaxPendingBytes: each
// such drop is counted, and the first of a burst logged. b.mu must be held.
func (b *Bridge) addLocked(e *pendingEntry, now time.Time) {
	e.elem = b.ids.order.PushBack(e)
	b.ids.bytes += e.weight()
	for b.ids.bytes > b.ids.max {
		b.dropLocked(b.ids.order.Front().Value.(*pendingEntry))
		b.overflows.Add(1)
		if b.ids.lastOverflow.IsZero() || now.Sub(b.ids.lastOverflow) >= overflowQuiet {
			b.log.Warn("bridge: the pending ids weigh more than MDPROXY_BRIDGE_PENDING_MAX_BYTES; the oldest are dropped, their polls go to Core (logged again after a minute without a drop)",
				"max_bytes", b.ids.max, "pending_ids", b.ids.order.Len(), "dropped_total", b.overflows.Load())
		}
		b.ids.lastOverflow = now
	}
}

// dropLocked forgets e, if it is still held. b.mu must be held.
func (b *Bridge) dropLocked(e *pendingEntry) {
	if e.elem == nil {
		return
	}
	b.drops.Add(1)
	b.ids.order.Remove(e.elem)
	e.elem = nil
	b.ids.bytes -= e.weight()
	if e.shared {
		if b.ids.shared[e.dataID] == e {
			delete(b.ids.shared, e.dataID)
		}
		return
	}
	if b.ids.own[e.dataID] == e {
		delete(b.ids.own, e.dataID)
	}
	if b.ids.bySecret[e.secret] == e {
		delete(b.ids.bySecret, e.secret)
	}
}

// sweepLocked drops the entries older than pendingTTL, at most once per refresh
// interval, so that ids nobody polls and whose callback never comes do not wait for
// the bound to go. b.mu must be held.
func (b *Bridge) sweepLocked(now time.Time) {
	if !b.ids.lastSweep.IsZero() && now.Sub(b.ids.lastSweep) < min(b.refresh, b.pendingTTL) {
		return
	}
	b.ids.lastSweep = now
	// A shared entry's submission time is another replica's: the order is not by age.
	for el := b.ids.order.Front(); el != nil; {
		e := el.Value.(*pendingEntry)
		el = el.Next()
		if now.Sub(e.submitted) > b.pendingTTL {
			b.dropLocked(e)
		}
	}
}

// entryLocked returns the pending entry of dataID: this replica's submission, or
// another's that the store (se, its Lookup) holds pending; nil if neither, or if the
// bound left no room for it. A shared entry the store no longer holds is forgotten, and
// one it holds anew (another owner or submission time) replaces the old. b.mu must be
// held.
func (b *Bridge) entryLocked(dataID string, se Entry, now time.Time) *pendingEntry {
	if e := b.ids.own[dataID]; e != nil {
		return e
	}
	e := b.ids.shared[dataID]
	if !se.IsPending {
		if e != nil {
			b.dropLocked(e)
		}
		return nil
	}
	p := se.Pending
	if e == nil || e.owner != p.Owner || !e.submitted.Equal(p.Submitted) {
		if e != nil {
			b.dropLocked(e)
		}
		e = &pendingEntry{dataID: dataID, owner: p.Owner, submitted: p.Submitted, shared: true}
		b.ids.shared[dataID] = e
		b.addLocked(e, now)
		if e.elem == nil {
			return nil
		}
	}
	return e
}

// knownLocked returns the pending entry of dataID as this replica knows it, without
// asking the store: its own, or a shared one a poll met. b.mu must be held.
func (b *Bridge) knownLocked(dataID string) *pendingEntry {
	if e := b.ids.own[dataID]; e != nil {
		return e
	}
	return b.ids.shared[dataID]
}

// setReplyLocked makes body, Core's reply (not final) about e's id, e's pending answer,
// unless the pending ids would then weigh more than MaxPendingBytes: then e keeps its
// answer (an earlier reply, or InProgress), which shows less progress. A reply never
// drops an id: the ids that wait for their callbacks cannot be pushed out by Core's
// replies (each up to 64 MiB). b.mu must be held.
func (b *Bridge) setReplyLocked(e *pendingEntry, body []byte, contentType string) {
	if e.elem == nil {
		return
	}
	var old int64
	if e.reply != nil {
		old = replyWeight(e.reply.body, e.reply.contentType)
	}
	n := replyWeight(body, contentType)
	if b.ids.bytes-old+n > b.ids.max {
		return
	}
	b.ids.bytes += n - old
	e.reply = &pendingReply{body: bytes.Clone(body), contentType: contentType}
}

// PendingLen returns the number of pending ids this replica submitted (not the ones of
// other replicas a shared store holds), after dropping those older than
// PendingTTL if a sweep is due (and forgetting the secrets given out and not submitted
// for issuedTTL).
func (b *Bridge) PendingLen() int {
	now := b.now()
	b.mu.Lock()
	defer b.mu.Unlock()
	b.sweepLocked(now)
	b.sweepIssuedLocked(now)
	return len(b.ids.own)
}

// PendingBytes returns the weight of the pending ids held, this replica's and the
// shared ones polls met, in bytes: each id's data_id and a fixed overhead, plus Core's
// reply it holds; at most MaxPendingBytes.
func (b *Bridge) PendingBytes() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.ids.bytes
}

// PendingDropped returns the number of pending ids dropped since New because the
// pending ids would have weighed more than MaxPendingBytes (not those whose time to
// live passed). It only grows.
func (b *Bridge) PendingDropped() uint64 {
	return b.overflows.Load()
}
