package proxy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"

	"golang.org/x/sync/singleflight"

	"github.com/mdproxy/mdproxy/bridge"
	"github.com/mdproxy/mdproxy/metrics"
)

// Bridge is what the proxy needs of the bridge (package bridge): a callback URL for
// each submission that brings none, the record of what Core accepted, and the answer to
// a poll of a data_id from what the bridge knows. *bridge.Bridge implements it.
type Bridge interface {
	Callback() (callbackURL, secret string, err error)
	Submitted(dataID, secret string, owner bridge.Owner)
	Poll(dataID string, owner bridge.Owner) bridge.Answer
	Observe(dataID string, owner bridge.Owner, body []byte, contentType string)
	Gone(dataID string, owner bridge.Owner)
	NotAsked(dataID string, owner bridge.Owner)
	LoggedOut(owner bridge.Owner)
	CallbackPrefix() string
}

var _ Bridge = (*bridge.Bridge)(nil)

// bridged is the bridge's side of a route: submit (a callback URL given to each
// submission that brings none, the data_id Core answers recorded), file_result (polls
// answered from what the bridge knows: poll.go), logout (the session's results
// forgotten) and webhook_status (the callback secrets redacted). Safe for concurrent
// use.
type bridged struct {
	bridge      Bridge
	poll        bool                      // GET /file/{data_id}: answered by the bridge (servePoll)
	readsAnswer bool                      // the proxy reads or shares Core's answers (askWholeAnswer)
	secrets     *regexp.Regexp            // webhook_status: the bridge's callback secrets
	flight      singleflight.Group        // one Core request for concurrent polls of an id
	buffers     *bridge.Budget            // Core's answers to polls held at once (Options.PollBuffers)
	lastOwner   atomic.Pointer[ownerMemo] // see ownerOf
	lastAnswer  atomic.Pointer[answerHeader]
}

// bridgeWith gives rt its side of the bridge b, if it has one, with buffers the budget
// of Core's answers to polls; the route counts the polls the bridge answers on m. It
// returns an error when b's callback URL does not parse.
func (rt *route) bridgeWith(b Bridge, buffers *bridge.Budget, m *metrics.Metrics) error {
	switch rt.name {
	case "submit":
		rt.bridged = &bridged{bridge: b, readsAnswer: true}
		rt.proxy.ModifyResponse = rt.recordSubmission
	case "file_result":
		rt.bridged = &bridged{bridge: b, poll: true, readsAnswer: true, buffers: buffers}
		rt.metrics.WithBridgePolls(m)
	case "logout":
		rt.bridged = &bridged{bridge: b}
		rt.proxy.ModifyResponse = rt.recordLogout
	case "webhook_status":
		cb, err := url.Parse(b.CallbackPrefix())
		if err != nil {
			return fmt.Errorf("proxy: the bridge's callback URL: %w", err)
		}
		rt.bridged = &bridged{bridge: b, readsAnswer: true, secrets: secretsPattern(cb.Path)}
		rt.proxy.ModifyResponse = rt.redactSecrets
	}
	return nil
}

// maxSubmitAnswer bounds the part of Core's answer to POST /file that the proxy reads to
// learn the data_id, and Core's webhook status it redacts, in bytes: 64 KiB. Core
// answers both with a small JSON object; each request in flight may hold this much.
const maxSubmitAnswer = 64 << 10

// submission is a POST /file the bridge registered a callback for.
type submission struct {
	secret string
	owner  bridge.Owner
}

// bridgeSubmission gives out, the request forwarded to Core for the POST /file in, the
// callback URL of the bridge's listener when it has no callbackurl of its own, and
// returns what to record once Core accepts it; nil for a submission that brings its own
// callbackurl, the client's business. It runs in the route's Rewrite, on the header as
// forwarded: httputil.ReverseProxy has removed the hop-by-hop fields, so a callbackurl
// the client names in Connection, which Core would never receive (RFC 9110, section
// 7.6.1), is none; and a submission the limit refuses is given no secret.
func (rt *route) bridgeSubmission(out, in *http.Request) *submission {
	if out.Header.Get("callbackurl") != "" {
		return nil
	}
	cb, secret, err := rt.bridged.bridge.Callback()
	if err != nil {
		rt.log.Warn("bridge: no callback URL; the submission is forwarded without one", "err", err.Error())
		return nil
	}
	out.Header["Callbackurl"] = []string{cb}
	return &submission{secret: secret, owner: rt.ownerOf(in)}
}

// askWholeAnswer makes h, the header of a request forwarded to Core whose answer the
// proxy reads (a bridged submission or poll, the webhook status it redacts) or shares
// between clients (a bridged poll), ask for Core's whole answer as it is: unencoded
// (Accept-Encoding: identity, RFC 9110, section 12.5.3) and with no Range (section
// 14.2) or precondition (section 13.1), each of which a server may ignore. Otherwise a
// gzip or a partial answer hides a callback secret from the redaction or a data_id
// from the bridge, and a 206, a 304 or a gzip answer to one client's poll reaches
// another, whose request asked none of it.
func askWholeAnswer(h http.Header) {
	for _, k := range [...]string{"Range", "If-Range", "If-Match", "If-None-Match", "If-Modified-Since", "If-Unmodified-Since"} {
		delete(h, k)
	}
	h["Accept-Encoding"] = identity
}

// identity is the Accept-Encoding value of askWholeAnswer.
var identity = []string{"identity"}

// acceptedCutError is Core's 200 to a submission that broke off before the proxy read
// it whole: Core took the file, and its data_id was lost on the way.
type acceptedCutError struct{ err error }

func (e *acceptedCutError) Error() string {
	return "Core's answer to a submission broke off: " + e.err.Error()
}

func (e *acceptedCutError) Unwrap() error { return e.err }

// recordSubmission is the submit route's ModifyResponse: when Core accepted a bridged
// submission, the data_id it answered is recorded as pending. Core's answer reaches the
// client unchanged.
func (rt *route) recordSubmission(resp *http.Response) error {
	ex := exchangeOf(resp.Request)
	if ex == nil || ex.sub == nil || resp.StatusCode != http.StatusOK {
		return nil
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxSubmitAnswer+1))
	if err != nil {
		return &acceptedCutError{err}
	}
	// What was read, then the rest of Core's answer (an answer over maxSubmitAnswer names
	// no data_id the bridge records, but reaches the client whole).
	resp.Body = readCloser{Reader: io.MultiReader(bytes.NewReader(body), resp.Body), Closer: resp.Body}
	var answer struct {
		DataID string `json:"data_id"`
	}
	if len(body) > maxSubmitAnswer || json.Unmarshal(body, &answer) != nil || answer.DataID == "" {
		rt.log.Warn("bridge: Core's answer to a submission names no data_id; its result will be polled from Core")
		return nil
	}
	rt.bridged.bridge.Submitted(answer.DataID, ex.sub.secret, ex.sub.owner)
	return nil
}

// recordLogout is the logout route's ModifyResponse with the bridge on: when Core ended
// a session (200 to POST /logout), the bridge answers that apikey's polls from nothing
// it kept any more (Bridge.LoggedOut): Core decides them, as it does without the bridge.
func (rt *route) recordLogout(resp *http.Response) error {
	if resp.StatusCode == http.StatusOK {
		rt.bridged.bridge.LoggedOut(rt.ownerOf(resp.Request))
	}
	return nil
}

// redactSecrets is the webhook_status route's ModifyResponse with the bridge on: Core's
// answer to GET /file/webhook/{data_id} shows the callback URL of a submission, and for a
// bridged one that URL holds the secret that makes a callback believed. The secret is
// replaced by "redacted", however the URL is spelt (secretsPattern); the rest of the
// answer reaches the client unchanged, its Content-Length adjusted.
func (rt *route) redactSecrets(resp *http.Response) error {
	if ce := resp.Header.Get("Content-Encoding"); (ce != "" && !strings.EqualFold(ce, "identity")) || resp.StatusCode == http.StatusPartialContent {
		// askWholeAnswer asked for none of these: what cannot be read whole is not
		// relayed, rather than a secret.
		return fmt.Errorf("Core's webhook status came encoded (%q) or partial (%d): it cannot be redacted", ce, resp.StatusCode)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxSubmitAnswer+1))
	if err != nil {
		return fmt.Errorf("reading Core's webhook status: %w", err)
	}
	if len(body) > maxSubmitAnswer {
		// Not a webhook status of Core's size: nothing of it is relayed rather than a
		// secret.
		return fmt.Errorf("Core's webhook status is over %d bytes", maxSubmitAnswer)
	}
	resp.Body.Close()
	body = rt.bridged.secrets.ReplaceAll(body, []byte("${1}redacted"))
	resp.Body = io.NopCloser(bytes.NewReader(body))
	resp.ContentLength = int64(len(body))
	resp.Header["Content-Length"] = []string{strconv.Itoa(len(body))}
	// Sent whole with its length: no trailer section follows (Core's, read with the
	// body, are not relayed), so none is announced.
	delete(resp.Header, "Trailer")
	resp.Trailer = nil
	return nil
}

// secretsPattern matches the bridge's callback secrets in Core's webhook status however
// their URL is spelt: callbackPath (the path of Bridge.CallbackPrefix) in any case, each
// slash as written, JSON-escaped (\/, \u002f) or percent-encoded (%2F), then the
// secret, 64 hex digits; the first group is what precedes the secret. The scheme and
// host are not matched, since Core may spell them otherwise (in upper case, localhost
// for 127.0.0.1): a client's own callbackurl with that path and a 64-digit token is
// redacted too, rather than a secret let through.
func secretsPattern(callbackPath string) *regexp.Regexp {
	parts := strings.Split(callbackPath, "/")
	for i, p := range parts {
		parts[i] = regexp.QuoteMeta(p)
	}
	const slash = `(?:/|\\/|\\u002f|%2f)`
	return regexp.MustCompile(`(?i)(` + strings.Join(parts, slash) + `)[0-9a-f]{64}`)
}

type readCloser struct {
	io.Reader
	io.Closer
}

// ownerOf returns the bridge's owner of r: the SHA-256 of its apikey. The last apikey
// and its owner are kept: a client polls with one apikey in a loop.
func (rt *route) ownerOf(r *http.Request) bridge.Owner {
	key := apikeyOf(r)
	if m := rt.bridged.lastOwner.Load(); m != nil && m.apikey == key {
		return m.owner
	}
	m := &ownerMemo{apikey: key, owner: bridge.OwnerOf(key)}
	rt.bridged.lastOwner.Store(m)
	return m.owner
}

type ownerMemo struct {
	apikey string
	owner  bridge.Owner
}
