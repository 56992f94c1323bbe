package proxy

import (
	"net/http"
	"time"

	"github.com/mdproxy/mdproxy/limiter"
)

// recorder records an answer's status and size and bounds each write by the body idle
// timeout (armWrite). Unwrap gives http.ResponseController the connection's writer.
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

func (w *recorder) decide(d limiter.Decision) {
	w.decision, w.decided = d.Outcome.String(), true
}

// armWrite sets the write deadline one idle timeout from now: a client that stops reading
// is cut instead of holding its connection. net/http's WriteTimeout counts from the request
// and would cut a long answer that progresses. An answer of the proxy's own allows for
// net/http's read of an unread body (discard) before it.
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

// maxInterim is the most 1xx answers of Core relayed for one request: net/http caps
// them only when nothing hooks them, and ReverseProxy does.
const maxInterim = 16

// ownPiece is the most of an answer of the proxy's own written under one deadline, in bytes.
const ownPiece = 64 << 10

func (w *recorder) WriteHeader(code int) {
	if code < 200 && w.http10 {
		return // RFC 9110, section 15.2: no 1xx to an HTTP/1.0 client
	}
	if code < 200 {
		if w.interim >= maxInterim {
			return
		}
		w.interim++
	}
	if code >= 200 && w.ex != nil && w.ex.bodyUnread() {
		// An answer before the body is all in ends the connection, and says so (RFC 9110,
		// section 10.1.1).
		w.close = true
	}
	if w.close {
		// ReverseProxy clears the header after a 1xx: the final answer says close again.
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

// noSniff keeps net/http from guessing a Content-Type Core did not give (RFC 9110,
// section 8.3): a nil value is written as nothing.
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
		w.armWrite()
		return w.write(p)
	}
	// An answer of the proxy's own: each piece moves the deadline on.
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

func (w *recorder) write(p []byte) (int, error) {
	n, err := w.ResponseWriter.Write(p)
	w.bytes += int64(n)
	if err != nil && w.writeErr == nil {
		w.writeErr = err
	}
	return n, err
}

func (w *recorder) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// abort ends the request without an answer (net/http closes the connection on
// http.ErrAbortHandler): returning would send a 200 neither Core nor the proxy gave.
func abort(rec *recorder) {
	rec.status = statusClientClosedRequest
	rec.aborted = true
	panic(http.ErrAbortHandler)
}

var closeValue = []string{"close"}
