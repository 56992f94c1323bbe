package bridge

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"
	"sync/atomic"
	"time"
)

// Handler is the callback listener's http.Handler: POST /callback/{secret} (after the
// path of CallbackURL, if it has one, or without it, as a proxy in front that takes it
// off passes it on) with a JSON body
// whose data_id is the pending id registered with that secret (constant-time comparison of
// the secret: crypto/subtle; look the secret up so that timing reveals nothing usable,
// e.g. keep pending entries by the SHA-256 of the secret), body at most MaxCallbackBytes,
// a final result: stored (owner = the submitter's), pending dropped, 200. Anything else
// changes nothing and is counted: wrong or unknown secret (404), replay after storing (404),
// data_id mismatch or invalid JSON or not final (400), oversized (413), other methods (405).
//
// The secret is looked up by its SHA-256, so the timing of the map look-up depends on a
// digest, which tells nothing of a secret, and the digest found is compared in constant
// time. A body is read only on a live secret path. Refusals answer Core's error format,
// {"err": "..."}. Each request is counted under one of the Outcome constants.
//
// A callback may arrive before Core's answer to its submission was recorded (a small
// file, scanned before the proxy read that answer): on a secret Callback gave out within
// issuedTTL and not yet submitted, a final result with a data_id is held (200, once per
// secret, its body held with those being read within MaxCallbackBytes in all) and
// Submitted stores it if its
// data_id is the one Core answered (counted stored), else drops it (counted invalid). A
// held result is served to no one before that.
func (b *Bridge) Handler() http.Handler {
	return http.HandlerFunc(b.serveCallback)
}

func (b *Bridge) serveCallback(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		b.refuse(w, &b.invalid, http.StatusMethodNotAllowed, "Method not allowed", "method", r.Method)
		return
	}
	secret, ok := strings.CutPrefix(r.URL.Path, b.basePath+CallbackPath)
	if !ok && b.basePath != "" {
		secret, ok = strings.CutPrefix(r.URL.Path, CallbackPath) // a proxy took the base path off
	}
	if !ok || secret == "" || strings.Contains(secret, "/") {
		b.refuse(w, &b.forged, http.StatusNotFound, "Not found", "reason", "path")
		return
	}
	h := sha256.Sum256([]byte(secret))
	b.mu.Lock()
	live := b.liveLocked(h)
	b.mu.Unlock()
	if !live {
		b.refuse(w, &b.forged, http.StatusNotFound, "Not found", "reason", "secret")
		return
	}

	if r.ContentLength > b.maxBody {
		b.refuse(w, &b.invalid, http.StatusRequestEntityTooLarge, "Request body too large", "reason", "size")
		return
	}
	need := r.ContentLength
	if need < 0 {
		need = b.maxBody
	}
	if !b.bodies.TryAcquire(need) {
		w.Header().Set("Retry-After", "1")
		b.refuse(w, &b.busy, http.StatusServiceUnavailable, "Server is too busy. Try again later.", "reason", "busy")
		return
	}
	defer func() { b.bodies.Release(need) }() // less what an early callback keeps held
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, b.maxBody))
	if err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			b.refuse(w, &b.invalid, http.StatusRequestEntityTooLarge, "Request body too large", "reason", "size")
			return
		}
		b.refuse(w, &b.invalid, http.StatusBadRequest, "Incomplete request body", "reason", "read", "err", err)
		return
	}
	if cap(body)-len(body) > len(body)/8 {
		body = bytes.Clone(body) // the store weighs len(body): hold no more than that
	}
	res, err := parseResult(body)
	switch {
	case err != nil:
		b.refuse(w, &b.invalid, http.StatusBadRequest, "Invalid JSON", "reason", "json")
		return
	case res.DataID == nil || *res.DataID == "":
		b.refuse(w, &b.invalid, http.StatusBadRequest, "Wrong data_id", "reason", "data_id")
		return
	case !res.final():
		b.refuse(w, &b.invalid, http.StatusBadRequest, "Result not final", "reason", "progress")
		return
	}
	ct := r.Header.Get("Content-Type")
	if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != jsonType {
		// The body is a JSON object: served as JSON whatever Core labelled it
		// ("application/jsonp" is not JSON; "Application/JSON" is, and kept).
		ct = jsonType
	}

	// Claim the secret: of concurrent deliveries, only one stores.
	now := b.now()
	b.mu.Lock()
	e := b.ids.bySecret[h]
	if e == nil || subtle.ConstantTimeCompare(e.secret[:], h[:]) != 1 {
		// Not submitted yet: hold an early callback for Submitted.
		ie := b.issued[h]
		if ie == nil || ie.early != nil || subtle.ConstantTimeCompare(ie.secret[:], h[:]) != 1 {
			b.mu.Unlock()
			b.refuse(w, &b.forged, http.StatusNotFound, "Not found", "reason", "secret")
			return
		}
		ie.early = &earlyCallback{body: body, dataID: *res.DataID, contentType: ct, at: now}
		need -= int64(len(body)) // held with the body, until forgetIssuedLocked
		b.mu.Unlock()
		b.log.Debug("bridge callback held until its submission is recorded")
		answerStored(w)
		return
	}
	if subtle.ConstantTimeCompare([]byte(*res.DataID), []byte(e.dataID)) != 1 {
		b.mu.Unlock()
		b.refuse(w, &b.invalid, http.StatusBadRequest, "Wrong data_id", "reason", "data_id")
		return
	}
	delete(b.ids.bySecret, h)
	b.calledBackLocked(now, e.submitted)
	b.mu.Unlock()

	b.store.Put(e.dataID, Result{Body: body, ContentType: ct, Owner: e.owner})
	b.mu.Lock()
	b.dropLocked(e)
	b.mu.Unlock()
	b.stored.Add(1)
	answerStored(w)
}

// liveLocked reports whether h is the SHA-256 of a live secret: of a pending id, or
// given out by Callback and not submitted yet, without an early callback. The map
// look-up's timing depends on h, a digest, and the digest found is compared in constant
// time. b.mu must be held.
func (b *Bridge) liveLocked(h [32]byte) bool {
	if e := b.ids.bySecret[h]; e != nil {
		return subtle.ConstantTimeCompare(e.secret[:], h[:]) == 1
	}
	if ie := b.issued[h]; ie != nil && ie.early == nil {
		return subtle.ConstantTimeCompare(ie.secret[:], h[:]) == 1
	}
	return false
}

// calledBackLocked records that a callback arrived at for an id submitted at submitted,
// for the overdue rules. b.mu must be held.
func (b *Bridge) calledBackLocked(at, submitted time.Time) {
	if at.After(b.lastCallback) {
		b.lastCallback = at
	}
	if submitted.After(b.newestCalledBack) {
		b.newestCalledBack = submitted
	}
}

// answerStored answers an accepted callback: 200 {}.
func answerStored(w http.ResponseWriter) {
	w.Header().Set("Content-Type", jsonType)
	w.WriteHeader(http.StatusOK)
	_, _ = io.WriteString(w, "{}")
}

// refuse answers a refused callback with status and Core's error body {"err": msg},
// counts it in n and logs it at debug level with attrs (never the secret).
func (b *Bridge) refuse(w http.ResponseWriter, n *atomic.Uint64, status int, msg string, attrs ...any) {
	n.Add(1)
	b.log.Debug("bridge callback refused", append([]any{"status", status}, attrs...)...)
	w.Header().Set("Content-Type", jsonType)
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = fmt.Fprintf(w, "{\"err\":%q}\n", msg)
}
