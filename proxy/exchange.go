package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mdproxy/mdproxy/metrics"
)

// Errors that end an exchange on a stalled or vanished peer.
var (
	errClientIdle = errors.New("the client sent nothing of its request body for the body idle timeout")
	errCoreGone   = errors.New("Core closed the connection before the request body was sent")
)

// forward sends r to Core and relays Core's answer to rec, bounded both ways (exchange).
func (rt *route) forward(rec *recorder, r *http.Request) {
	w := rec.ResponseWriter // the server's own: its deadlines, its full duplex
	ex := newExchange(w, r, rt.bodyIdle)
	defer ex.finish()
	rec.ex = ex
	hasBody := r.Body != nil && r.Body != http.NoBody
	if hasBody {
		defer func() { rt.metrics.RequestBytes(ex.reqBytes.Load()) }()
	} else {
		ex.bodyDone = true
	}
	// The body is wrapped in the forwarded copy of r: net/http closes its own body type gently
	// after the handler (closeWriteAndWait).
	out := r.WithContext(ex.trace(context.WithValue(r.Context(), exchangeKey{}, ex)))
	if hasBody {
		// Core may answer before it has read the whole body: full duplex leaves the rest to the
		// transport, not to net/http's read of up to 256 KiB before the answer.
		_ = http.NewResponseController(w).EnableFullDuplex()
		out.Body = &requestBody{body: r.Body, ex: ex}
	}
	rt.proxy.ServeHTTP(rec, out)
	rec.forwarded = true
}

type exchangeKey struct{}

// deadliner is net/http's ResponseWriter's deadlines (what http.ResponseController calls).
type deadliner interface {
	SetReadDeadline(time.Time) error
	SetWriteDeadline(time.Time) error
}

// exchange is one forwarded request in both directions: it bounds the client's silence
// while sending its body, records why Core's answer ended early, and cuts the upload at
// once when Core's connection closes under it. Safe for concurrent use (the transport's
// goroutines and the handler's).
type exchange struct {
	idle   time.Duration   // 0: no idle bound
	client deadliner       // nil when the ResponseWriter has no deadlines
	ctx    context.Context // the client's request context
	sub    *submission     // a POST /file the bridge gave a callback URL (the Rewrite sets it); nil otherwise
	shared bool            // a poll the bridge sends Core, whose answer it reads and shares (askWholeAnswer)

	mu       sync.Mutex
	core     *coreConn // Core's connection carrying the upload; nil until known
	bodyDone bool      // the request body was read to its end (or has none)
	asked    bool      // a read of the request body was asked: the client sends it
	released bool      // the transport closed the request body: it reads no more of it
	finished bool      // the handler returned: the client connection is no longer ours
	coreGone bool      // Core's connection closed while the request body was being read

	reqBytes atomic.Int64
	reqErr   atomic.Pointer[error] // the first error reading the request body, not EOF
	respErr  atomic.Pointer[error] // the first error reading Core's response body, not EOF
}

func newExchange(w http.ResponseWriter, r *http.Request, idle time.Duration) *exchange {
	ex := &exchange{idle: idle, ctx: r.Context()}
	ex.client, _ = w.(deadliner)
	if ex.client == nil {
		ex.idle = 0
	}
	return ex
}

// requestBody is the client's body as the transport reads it: counted, each read bounded by
// the idle timeout, ended by errCoreGone once Core has gone. Close ends the transport's reads
// only: the handler may still drain the client's body (exchange.drain).
type requestBody struct {
	body io.Reader
	ex   *exchange
}

func (b *requestBody) Read(p []byte) (int, error) {
	ex := b.ex
	ex.mu.Lock()
	if ex.released {
		ex.mu.Unlock()
		return 0, http.ErrBodyReadAfterClose
	}
	if ex.coreGone {
		ex.mu.Unlock()
		return 0, errCoreGone
	}
	if ex.idle > 0 {
		now := time.Now()
		_ = ex.client.SetReadDeadline(now.Add(ex.idle))
		if !ex.asked {
			// net/http writes 100 Continue at the first read: bounded too.
			_ = ex.client.SetWriteDeadline(now.Add(ex.idle))
		}
	}
	ex.asked = true
	ex.mu.Unlock()

	n, err := b.body.Read(p)
	ex.reqBytes.Add(int64(n))
	if err == nil {
		return n, nil
	}
	ex.mu.Lock()
	defer ex.mu.Unlock()
	switch {
	case err == io.EOF:
		ex.bodyDone = true
		// The server's background read starts now: no idle deadline on it.
		if ex.idle > 0 && !ex.finished {
			_ = ex.client.SetReadDeadline(time.Time{})
		}
		return n, err
	case ex.coreGone:
		err = errCoreGone
	case errors.Is(err, os.ErrDeadlineExceeded):
		err = errClientIdle
	}
	ex.reqErr.CompareAndSwap(nil, &err)
	return n, err
}

func (b *requestBody) Close() error {
	b.ex.mu.Lock()
	b.ex.released = true
	b.ex.mu.Unlock()
	return nil
}

// maxDrain bounds the rest of a request body drain reads and discards: 16 MiB, more than
// Linux's default socket buffers hold in flight.
const maxDrain = 16 << 20

// drain reads and discards the rest of the request body once the answer is written, so that
// the connection is not closed (and reset by the kernel) under a client still sending: a
// client may then fail without reading the answer (curl: "Send failure: Connection reset by
// peer"). net/http reads at most 256 KiB itself, and none behind Expect: 100-continue. It
// reads at most maxDrain (then http.MaxBytesReader closes the connection gently, RFC 9112,
// section 9.6), within the body idle timeout, and nothing of a body never asked for or that
// failed. Called by the handler's goroutine after finish.
func (ex *exchange) drain(w http.ResponseWriter, r *http.Request) {
	ex.mu.Lock()
	drains := ex.asked && !ex.bodyDone
	ex.mu.Unlock()
	if err := ex.requestFailed(); !drains || (err != nil && err != errCoreGone) {
		return
	}
	if http.NewResponseController(w).Flush() != nil {
		return
	}
	if ex.idle > 0 {
		_ = ex.client.SetReadDeadline(time.Now().Add(ex.idle))
	}
	_, _ = io.Copy(io.Discard, http.MaxBytesReader(w, r.Body, maxDrain))
}

// requestFailed returns the error that ended the request body early, or nil.
func (ex *exchange) requestFailed() error {
	if p := ex.reqErr.Load(); p != nil {
		return *p
	}
	return nil
}

func (ex *exchange) bodyUnread() bool {
	ex.mu.Lock()
	defer ex.mu.Unlock()
	return !ex.bodyDone
}

func (ex *exchange) responseFailed() error {
	if p := ex.respErr.Load(); p != nil {
		return *p
	}
	return nil
}

// coreClosed is called when Core's connection closes: while the body is still being read,
// the client's pending read is cut so the client gets 502 at once. After the client left,
// it is the client leaving (499), not Core.
func (ex *exchange) coreClosed() {
	ex.mu.Lock()
	defer ex.mu.Unlock()
	if ex.bodyDone || ex.finished || ex.coreGone || ex.ctx.Err() != nil {
		return
	}
	ex.coreGone = true
	if ex.client != nil {
		_ = ex.client.SetReadDeadline(time.Now())
	}
}

// finish ends the exchange: while the body is unread, net/http's own later reads of it get
// a read deadline one idle timeout away; the write deadline of the last write stays
// (recorder.armWrite) for the answer's last bytes net/http writes after the handler.
func (ex *exchange) finish() {
	ex.mu.Lock()
	defer ex.mu.Unlock()
	ex.finished = true
	if ex.core != nil {
		ex.core.unwatch(ex)
	}
	if ex.idle > 0 && !ex.bodyDone && ex.requestFailed() == nil {
		_ = ex.client.SetReadDeadline(time.Now().Add(ex.idle))
	}
}

// trace returns ctx with a ClientTrace that ties Core's connection to ex (coreConn).
func (ex *exchange) trace(ctx context.Context) context.Context {
	return httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		GotConn: func(info httptrace.GotConnInfo) {
			if c := coreConnOf(info.Conn); c != nil {
				c.answering.Store(false)
				ex.mu.Lock()
				ex.core = c
				upload := !ex.bodyDone
				ex.mu.Unlock()
				if upload {
					c.watch(ex)
				}
			}
		},
	})
}

// answered is called once Core's answer's headers are in: reads are of its body from now.
func (ex *exchange) answered() {
	ex.mu.Lock()
	c := ex.core
	ex.mu.Unlock()
	if c != nil {
		c.answering.Store(true)
	}
}

// responseBody records the error that ended Core's response body early.
type responseBody struct {
	io.ReadCloser
	ex *exchange
}

func (b *responseBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil && err != io.EOF {
		b.ex.respErr.CompareAndSwap(nil, &err)
	}
	return n, err
}

func exchangeOf(r *http.Request) *exchange {
	ex, _ := r.Context().Value(exchangeKey{}).(*exchange)
	return ex
}

func isDeadline(err error) bool {
	var ne net.Error
	return errors.Is(err, os.ErrDeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}

// timedTransport counts Core's answers by status, with the time to their headers.
type timedTransport struct {
	next http.RoundTripper
	m    *metrics.Route
}

func (t timedTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	start := time.Now()
	resp, err := t.next.RoundTrip(r)
	if err == nil && (resp.StatusCode < 100 || resp.StatusCode > 599) {
		// RFC 9110, section 15: a status is 100 to 599.
		resp.Body.Close()
		return nil, &badStatusError{resp.StatusCode}
	}
	if err == nil {
		t.m.UpstreamAnswered(resp.StatusCode, time.Since(start))
		if ex := exchangeOf(r); ex != nil {
			ex.answered()
			if resp.Body != nil && resp.Body != http.NoBody {
				resp.Body = &responseBody{ReadCloser: resp.Body, ex: ex}
			}
		}
	}
	return resp, err
}

type badStatusError struct{ code int }

func (e *badStatusError) Error() string {
	return fmt.Sprintf("Core answered with status %03d, outside 100 to 599", e.code)
}

// copyBuffers recycles ReverseProxy's 32 KiB copy buffers.
var copyBuffers = &bufferPool{sync.Pool{New: func() any { return new([32 << 10]byte) }}}

type bufferPool struct{ p sync.Pool }

func (b *bufferPool) Get() []byte { return b.p.Get().(*[32 << 10]byte)[:] }

func (b *bufferPool) Put(buf []byte) {
	if cap(buf) == 32<<10 {
		b.p.Put((*[32 << 10]byte)(buf[:32<<10]))
	}
}
