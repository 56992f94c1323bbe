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

// Errors that end an exchange on a stalled or vanished peer. classify and the
// handler's recovery read them to answer and count each case.
var (
	// errClientIdle: the client sent no byte of its request body for the body idle
	// timeout.
	errClientIdle = errors.New("the client sent nothing of its request body for the body idle timeout")
	// errCoreGone: Core's connection closed while the client's request body was
	// still being read; the read was cut so that the client learns it at once.
	errCoreGone = errors.New("Core closed the connection before the request body was sent")
)

// forward sends r to Core and relays Core's answer to rec, within an exchange that
// bounds both directions (exchange). Once Core's answer is relayed, or cut,
// rec.forwarded is set.
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
	// The body is wrapped in the copy of r that is forwarded, never in r itself:
	// net/http looks at r.Body after the handler, to end the connection gently after
	// a large body left unread (closeWriteAndWait), which it does only for its own
	// body type.
	out := r.WithContext(ex.trace(context.WithValue(r.Context(), exchangeKey{}, ex)))
	if hasBody {
		// Core may answer before it has the whole body and read on. net/http would
		// then read the rest of a body under 256 KiB itself before it writes the
		// answer, taking it from the transport that forwards it (Core's upload cut
		// short, and a streamed answer with it): full duplex leaves the body to the
		// transport, and to drain once the answer is written.
		_ = http.NewResponseController(w).EnableFullDuplex()
		out.Body = &requestBody{body: r.Body, ex: ex}
	}
	rt.proxy.ServeHTTP(rec, out)
	rec.forwarded = true
}

// exchangeKey is the context key of a forwarded request's *exchange.
type exchangeKey struct{}

// deadliner is what the connection of an answer offers to bound its reads and writes:
// net/http's own ResponseWriter has both methods (the ones http.ResponseController
// calls).
type deadliner interface {
	SetReadDeadline(time.Time) error
	SetWriteDeadline(time.Time) error
}

// exchange is the state of one forwarded request in both directions. It bounds how
// long the client may make no progress sending its body, records why Core's response
// body ended early, and cuts the client's upload at once when Core's connection closes
// under it. It is safe for concurrent use: the transport's goroutines read the request
// body and close Core's connection while the handler's goroutine answers.
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

// requestBody wraps the client's request body for the transport: it counts bytes,
// bounds the wait for each read by the idle timeout, and ends with errCoreGone once
// Core has gone. Its Close ends the transport's reads and leaves the client's body
// open: net/http closes that after the handler, and the handler may first read what
// the client still sends (exchange.drain).
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
			// net/http writes "100 Continue" to a client that asked for it at the
			// body's first read, before any answer: bounded, or it would block for
			// ever on a client that stopped reading earlier answers on the connection.
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
		// The server's background read of the connection starts now: it must not
		// inherit the idle deadline, or a slow answer from Core would cut it.
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

// Close ends the transport's reads of the body; a read already under way finishes.
func (b *requestBody) Close() error {
	b.ex.mu.Lock()
	b.ex.released = true
	b.ex.mu.Unlock()
	return nil
}

// maxDrain is the most of the rest of a request body that the proxy reads and
// discards after its answer, in bytes (exchange.drain): 16 MiB, more than a client
// has in flight when it learns the answer with Linux's default socket buffers (up to
// 6 MiB received and not yet read, and 4 MiB sent and not yet acknowledged).
const maxDrain = 16 << 20

// drain reads and discards what the client still sends of its request body once the
// exchange is over and its answer written (Core's early answer, or the proxy's own: a
// 502 when Core went away under the upload, a 504 when it stopped reading it), so that
// the client's connection is not closed under a client still sending: a close with the
// client's data unread makes the kernel reset the connection, and a client may then
// fail on its next write without reading the answer waiting for it (curl does: "Send
// failure: Connection reset by peer"). net/http itself reads at most 256 KiB more of a
// body its handler left, and behind "Expect: 100-continue" closes the connection at
// once, reset (it ends one gently, closing its writing side and waiting a moment
// first, closeWriteAndWait, only for a plain body). The answer says Connection: close
// (recorder.WriteHeader).
//
// It reads until the body ends or the client stops (closes, or sends nothing for the
// body idle timeout, counted from the answer), and at most maxDrain bytes: past them,
// http.MaxBytesReader makes net/http end the connection gently (RFC 9112, section
// 9.6), whatever the body's type. It reads nothing of a body the client was never asked
// for (it waits for a 100 Continue it did not get), nor of one that ended in the
// client's error or silence. Called by the handler's goroutine after finish, with w the
// server's own ResponseWriter and r the client's request.
func (ex *exchange) drain(w http.ResponseWriter, r *http.Request) {
	ex.mu.Lock()
	drains := ex.asked && !ex.bodyDone
	ex.mu.Unlock()
	if err := ex.requestFailed(); !drains || (err != nil && err != errCoreGone) {
		return
	}
	// A short answer waits in net/http's buffer until the handler returns: it must
	// be on its way before the proxy reads on.
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

// bodyUnread reports whether the request has a body not read to its end.
func (ex *exchange) bodyUnread() bool {
	ex.mu.Lock()
	defer ex.mu.Unlock()
	return !ex.bodyDone
}

// responseFailed returns the error that ended Core's response body early, or nil.
func (ex *exchange) responseFailed() error {
	if p := ex.respErr.Load(); p != nil {
		return *p
	}
	return nil
}

// coreClosed is called when Core's connection carrying this request closes. While the
// request body is still being read, nothing can reach Core any more: the client's
// pending read is cut (its deadline set to now), so that the transport gives up and
// the client is answered 502 instead of waiting on an upload that goes nowhere.
//
// A client that went away first makes the transport close Core's connection too: that
// is the client leaving (499), not Core going away.
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

// finish is called when the handler's exchange ends: the client connection goes back
// to the server with a read deadline one body idle timeout away while the body is not
// read to its end (net/http's own reads of it), none after, and with the write deadline
// of the answer's last write (recorder.armWrite): net/http writes the answer's last
// bytes after the handler, and a client that stopped reading must not hold that write
// for ever (net/http clears the deadline once they are out).
func (ex *exchange) finish() {
	ex.mu.Lock()
	defer ex.mu.Unlock()
	ex.finished = true
	if ex.core != nil {
		ex.core.unwatch(ex)
	}
	if ex.idle > 0 && !ex.bodyDone && ex.requestFailed() == nil {
		// net/http reads the rest of a body of up to 256 KiB after the handler (and
		// closes the connection after one longer): that read is bounded like ours
		// (drain sets its own), or a client gone silent would hold the connection
		// until it closed it. A body that failed keeps the deadline that cut it,
		// past already: net/http gives up the rest at once.
		_ = ex.client.SetReadDeadline(time.Now().Add(ex.idle))
	}
}

// trace returns ctx with a ClientTrace that ties Core's connection to ex: until
// answered, its reads wait for the answer's headers (coreConn.answering); and, while
// the request has a body to send, its closing reaches coreClosed.
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

// answered is called once the headers of Core's answer are in: the reads of Core's
// connection are of its body from now on, each bounded by the body idle timeout.
func (ex *exchange) answered() {
	ex.mu.Lock()
	c := ex.core
	ex.mu.Unlock()
	if c != nil {
		c.answering.Store(true)
	}
}

// responseBody wraps Core's response body and records the error that ended it early.
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

// exchangeOf returns the exchange of a request forwarded by the proxy, or nil.
func exchangeOf(r *http.Request) *exchange {
	ex, _ := r.Context().Value(exchangeKey{}).(*exchange)
	return ex
}

// isDeadline reports whether err is a read or write deadline passing.
func isDeadline(err error) bool {
	var ne net.Error
	return errors.Is(err, os.ErrDeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}

// timedTransport counts Core's answers by status code, with the time to their
// headers (metrics.Route.UpstreamAnswered).
type timedTransport struct {
	next http.RoundTripper
	m    *metrics.Route
}

func (t timedTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	start := time.Now()
	resp, err := t.next.RoundTrip(r)
	if err == nil && (resp.StatusCode < 100 || resp.StatusCode > 599) {
		// RFC 9110, section 15: a status is 100 to 599. net/http reads any three
		// digits; relayed, 099 read as a 1xx became a 200 of the proxy's, and 999
		// went to the client and into the metrics' code label.
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

// badStatusError is Core's answer with a status outside 100 to 599.
type badStatusError struct{ code int }

func (e *badStatusError) Error() string {
	return fmt.Sprintf("Core answered with status %03d, outside 100 to 599", e.code)
}

// copyBuffers recycles the 32 KiB buffers ReverseProxy copies bodies through.
var copyBuffers = &bufferPool{sync.Pool{New: func() any { return new([32 << 10]byte) }}}

type bufferPool struct{ p sync.Pool }

func (b *bufferPool) Get() []byte { return b.p.Get().(*[32 << 10]byte)[:] }

func (b *bufferPool) Put(buf []byte) {
	if cap(buf) == 32<<10 {
		b.p.Put((*[32 << 10]byte)(buf[:32<<10]))
	}
}
