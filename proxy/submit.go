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

// Bridge is what the proxy needs of the bridge; *bridge.Bridge implements it.
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

// bridged is the bridge's side of a route: submit (a callback URL for a submission without
// one, the data_id recorded), file_result (polls answered: poll.go), logout (the session's
// results forgotten), webhook_status (callback secrets redacted). Safe for concurrent use.
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

// bridgeWith gives rt its side of b, if any; it fails when b's callback URL does not parse.
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

// maxSubmitAnswer bounds, in bytes, what the proxy reads of Core's answer to POST /file and
// of the webhook status it redacts: both are small JSON objects.
const maxSubmitAnswer = 64 << 10

// submission is a POST /file the bridge registered a callback for.
type submission struct {
	secret string
	owner  bridge.Owner
}

// bridgeSubmission gives out, the request to Core, the bridge's callback URL when it has no
// callbackurl of its own, and returns what to record once Core accepts it (nil: the
// client's own callback). It runs in Rewrite, after the hop-by-hop fields are removed: a
// callbackurl named in Connection is none (RFC 9110, section 7.6.1).
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

// askWholeAnswer makes h, of a request whose answer the proxy reads or shares between
// clients, ask for Core's whole answer: unencoded (RFC 9110, section 12.5.3), no Range
// (section 14.2) nor precondition (section 13.1). A gzip or partial answer would hide a
// secret or a data_id, or reach a client who never asked for it.
func askWholeAnswer(h http.Header) {
	for _, k := range [...]string{"Range", "If-Range", "If-Match", "If-None-Match", "If-Modified-Since", "If-Unmodified-Since"} {
		delete(h, k)
	}
	h["Accept-Encoding"] = identity
}

var identity = []string{"identity"}

// acceptedCutError is Core's 200 to a submission cut before its data_id was read.
type acceptedCutError struct{ err error }

func (e *acceptedCutError) Error() string {
	return "Core's answer to a submission broke off: " + e.err.Error()
}

func (e *acceptedCutError) Unwrap() error { return e.err }

// recordSubmission (ModifyResponse) records the data_id of a bridged submission Core
// accepted as pending; Core's answer reaches the client unchanged.
func (rt *route) recordSubmission(resp *http.Response) error {
	ex := exchangeOf(resp.Request)
	if ex == nil || ex.sub == nil || resp.StatusCode != http.StatusOK {
		return nil
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxSubmitAnswer+1))
	if err != nil {
		return &acceptedCutError{err}
	}
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

// recordLogout (ModifyResponse): after Core's 200 to POST /logout the bridge forgets that
// apikey's results (Bridge.LoggedOut), so Core decides its polls, as without the bridge.
func (rt *route) recordLogout(resp *http.Response) error {
	if resp.StatusCode == http.StatusOK {
		rt.bridged.bridge.LoggedOut(rt.ownerOf(resp.Request))
	}
	return nil
}

// redactSecrets (ModifyResponse) replaces the bridge's callback secrets in Core's webhook
// status by "redacted" (secretsPattern), Content-Length adjusted.
func (rt *route) redactSecrets(resp *http.Response) error {
	if ce := resp.Header.Get("Content-Encoding"); (ce != "" && !strings.EqualFold(ce, "identity")) || resp.StatusCode == http.StatusPartialContent {
		return fmt.Errorf("Core's webhook status came encoded (%q) or partial (%d): it cannot be redacted", ce, resp.StatusCode)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxSubmitAnswer+1))
	if err != nil {
		return fmt.Errorf("reading Core's webhook status: %w", err)
	}
	if len(body) > maxSubmitAnswer {
		return fmt.Errorf("Core's webhook status is over %d bytes", maxSubmitAnswer)
	}
	resp.Body.Close()
	body = rt.bridged.secrets.ReplaceAll(body, []byte("${1}redacted"))
	resp.Body = io.NopCloser(bytes.NewReader(body))
	resp.ContentLength = int64(len(body))
	resp.Header["Content-Length"] = []string{strconv.Itoa(len(body))}
	delete(resp.Header, "Trailer")
	resp.Trailer = nil
	return nil
}

// secretsPattern matches a callback secret however its URL is spelt: callbackPath in any
// case, each slash as written, JSON-escaped or percent-encoded, then 64 hex digits; group
// 1 precedes the secret. Scheme and host are not matched (Core may spell them otherwise).
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
