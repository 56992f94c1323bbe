package proxy

import (
	"net/http"
	"time"

	"github.com/mdproxy/mdproxy/limiter"
)

// recorder remembers the status and body size of an answer, and bounds each of its
// writes by the body idle timeout (armWrite). It unwraps to the connection's writer, so
// that http.ResponseController (and so ReverseProxy's flushes) reach it.
type recorder struct {
	http.ResponseWriter
	status    int
	bytes     int64
	idle      time.Duration // the body idle timeout; 0: writes unbounded
	discard   time.Duration // how long net/http may read an unread body before it writes
	http10    bool          // the client speaks HTTP/1.0: no 1xx may reach it
	close     bool          // the connection ends after the answer (CloseAfter, or the body's end not in)
	interim   uint8         // the 1xx answers relayed, at most maxInterim
	aborted   bool          // abort cut the request, already counted
	decided   bool          // decision is the limiter's, counted by finish (decide)
	forwarded bool          // Core's answer was relayed to the end or cut (route.forward)
	ex        *exchange     // nil for answers the proxy gives itself
	writeErr  error         // the first failed write to the client
	decision  string        // the limiter's outcome (or the bridge's source); "": neither
	start     time.Time     // when the request reached the route: its duration, its Date
}

// decide records d as the limiter's decision for the request, counted once by finish.
func (w *recorder) decide(d limiter.Decision) {
	w.decision, w.decided = d.Outcome.String(), true
}

// armWrite sets the client connection's write deadline one body idle timeout from
// now, for the writes that follow: a client that stops reading its answer (its socket
// buffers full, for a long answer or for many short ones sent back to back) has its
// connection closed then, instead of holding it, its goroutine and its buffers for
// ever. net/http's own WriteTimeout counts from the request's arrival and would cut a
// long answer that progresses; this one counts from the last write. net/http writes
// an answer's last bytes after the handler returns, within the deadline the last write
// set, then clears it for the connection's next request. Before it writes the
// header of an answer the proxy gives without forwarding, net/http reads what is left
// of a body nobody read (up to 256 KiB, for at most discard): the deadline allows for
// that wait too. A forwarded body is left to the handler (full duplex, route.forward).
func (w *recorder) armWrite() {
	if w.idle <= 0 {
		return
	}
	d, ok := w.ResponseWriter.(deadliner)
	if !ok {
		return
	}
	bound := w.idle
	if w.discard > 0 && w.ex == nil {
		bound += w.discard
	}
	_ = d.SetWriteDeadline(time.Now().Add(bound))
}

// maxInterim is the most 1xx answers of Core's relayed to a client for one request.
const maxInterim = 16

// ownPiece is the most the proxy writes of an answer of its own (a stored result) in
// one write, in bytes, its write deadline moved on before each piece: a slow client
// that keeps reading a long answer is not cut.
const ownPiece = 64 << 10

func (w *recorder) WriteHeader(code int) {
	if code < 200 && w.http10 {
		return // RFC 9110, section 15.2: no 1xx to an HTTP/1.0 client
	}
	if code < 200 {
		// net/http caps Core's 1xx answers only when nobody hooks them, and
		// ReverseProxy does: the client gets the first maxInterim, not a flood.
		if w.interim >= maxInterim {
			return
		}
		w.interim++
	}
	if code >= 200 && w.ex != nil && w.ex.bodyUnread() {
		// The answer starts before the client's body is all in (Core answered
		// early, or the proxy cut the exchange): the connection ends after it, and
		// the answer says so (RFC 9110, section 10.1.1), as net/http's does when it
		// does not read the rest first; with the body left to the handler (full
		// duplex), net/http says so only behind "Expect: 100-continue".
		w.close = true
	}
	if w.close {
		// ReverseProxy clears the header map after relaying Core's 1xx (100
		// Continue, 103): the final answer says Connection: close again, a 1xx not.
		if code >= 200 {
			w.Header()["Connection"] = closeValue
		} else {
			delete(w.Header(), "Connection")
		}
	}
	if w.status == 0 && code >= 200 {
		w.status = code
	}
	if w.ex != nil && code >= 200 {
		noSniff(w.Header()) // Core's answer, relayed
	}
	w.armWrite() // a 1xx is written at once; a final status with the first body bytes
	w.ResponseWriter.WriteHeader(code)
}

// noSniff keeps net/http from giving an answer without a Content-Type one guessed from
// its first bytes (a "text/html" for a sanitized file that starts like HTML): the proxy
// relays Core's media type, and none when Core gave none (RFC 9110, section 8.3). A nil
// value is written as nothing.
func noSniff(h http.Header) {
	if _, ok := h["Content-Type"]; !ok {
		h["Content-Type"] = nil
	}
}

func (w *recorder) Write(p []byte) (int, error) {
	implicit := w.status == 0 // net/http writes a 200 header now, no WriteHeader armed it
	if implicit {
		w.status = http.StatusOK
	}
	if w.ex != nil {
		// Core's answer, relayed as it comes: each write may wait on the client.
		w.armWrite()
		return w.write(p)
	}
	// An answer of the proxy's own, whole in memory: the header's deadline covers its
	// first piece, and each piece after moves it on.
	if implicit {
		w.armWrite()
	}
	n := 0
	for {
		k, err := w.write(p[:min(len(p), ownPiece)])
		n += k
		p = p[k:]
		if err != nil || len(p) == 0 {
			return n, err
		}
		w.armWrite()
	}
}

// write writes p to the client and counts it.
func (w *recorder) write(p []byte) (int, error) {
	n, err := w.ResponseWriter.Write(p)
	w.bytes += int64(n)
	if err != nil && w.writeErr == nil {
		w.writeErr = err
	}
	return n, err
}

func (w *recorder) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// abort ends the request without an answer: net/http recovers http.ErrAbortHandler
// and closes the connection without writing anything. A handler that merely returned
// would make net/http send "200 OK" with an empty body, a status that neither Core
// nor the proxy gave, which a client could take for Core's answer.
func abort(rec *recorder) {
	rec.status = statusClientClosedRequest
	rec.aborted = true
	panic(http.ErrAbortHandler)
}

// closeValue is the Connection field value that ends a connection after the answer.
var closeValue = []string{"close"}
