package proxy

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/mdproxy/mdproxy/metrics"
)

// errorBody renders msg in Core's error format, {"err": msg} (docs/core-api.md, "Errors").
func errorBody(msg string) []byte {
	body, _ := json.Marshal(struct {
		Err string `json:"err"`
	}{msg})
	return body
}

// writeError answers status with msg in Core's error format.
func writeError(w http.ResponseWriter, status int, msg string) {
	writeBody(w, status, errorBody(msg))
}

func writeBody(w http.ResponseWriter, status int, body []byte) {
	h := w.Header()
	h["Content-Type"] = jsonContentType
	h["Content-Length"] = []string{strconv.Itoa(len(body))}
	h["X-Content-Type-Options"] = nosniff
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// Header values shared by every answer; net/http never modifies them.
var (
	jsonContentType = []string{"application/json; charset=utf-8"}
	nosniff         = []string{"nosniff"}
)

// failed is a failed round trip to Core: the answer and what is counted.
type failed struct {
	// status 0: nothing is sent, the client left.
	status int
	msg    string
	// counted, when not 0, is the status counted: 499 for a client whose upload broke.
	counted int
	kind    string // the upstream error kind counted (metrics.Kinds); "": none
	peer    string // the peer whose body timeout is counted (metrics.PeerClient, PeerCore); "": none
	log     bool   // worth a (sampled) line in the log
}

// roundTrip is what failure needs beside the error.
type roundTrip struct {
	bodyErr                   error
	clientGone, chunked       bool
	bodyIdle, upstreamTimeout time.Duration
}

// failure maps err, a round trip's error, to the client's answer: 408 when the client stopped
// sending, nothing to a client gone and 400 to a broken upload, 502 when Core refused,
// reset, could not be reached or cut its 200 to a submission, 504 when Core sent no headers
// in time or made no progress for the body idle timeout. A pure function.
func failure(err error, rt roundTrip) failed {
	if errors.Is(rt.bodyErr, errClientIdle) {
		return failed{status: http.StatusRequestTimeout, peer: metrics.PeerClient,
			msg: fmt.Sprintf("The request body made no progress for %v.", rt.bodyIdle)}
	}
	kind := classify(err, rt)
	switch kind {
	case metrics.KindCanceled:
		if rt.clientGone {
			return failed{kind: kind}
		}
		msg := "The request body ended before its Content-Length."
		if rt.chunked {
			msg = "The request body's chunked encoding is malformed or ended early."
		}
		return failed{status: http.StatusBadRequest, counted: statusClientClosedRequest, msg: msg, kind: kind}
	case metrics.KindTimeout:
		switch {
		case isDial(err):
			return failed{status: http.StatusBadGateway, msg: "Core could not be reached: connect timeout.", kind: kind, log: true}
		case errors.Is(err, os.ErrDeadlineExceeded):
			// A deadline of Core's connection, not the header timeout.
			return failed{status: http.StatusGatewayTimeout, peer: metrics.PeerCore, kind: kind, log: true,
				msg: fmt.Sprintf("Core made no progress on the request for %v.", rt.bodyIdle)}
		}
		return failed{status: http.StatusGatewayTimeout, kind: kind, log: true,
			msg: fmt.Sprintf("Core did not answer within %v.", rt.upstreamTimeout)}
	}
	msg := "Core could not be reached: " + kind + "."
	var bad *badStatusError
	switch {
	case isTLS(err):
		msg = "Core could not be reached: TLS handshake failed (see mdproxy's log)."
	case errors.As(err, new(*acceptedCutError)):
		// Not "could not be reached": a client told so may submit again.
		msg = "Core accepted the file (200) but its answer broke off before the data_id: the scan may be running."
	case errors.As(err, &bad):
		msg = fmt.Sprintf("Core's answer has an invalid status (%03d).", bad.code)
	case strings.HasPrefix(err.Error(), "backend tried to switch protocol"):
		// ReverseProxy's untyped error for a 101 to a request that asked no upgrade.
		msg = "Core switched protocols (101): Core's API has no protocol upgrade, so none is relayed."
	}
	return failed{status: http.StatusBadGateway, msg: msg, kind: kind, log: true}
}

// classify names the kind of a forwarded request's round trip error (metrics.Kinds).
func classify(err error, rt roundTrip) string {
	var ne net.Error
	switch {
	case errors.Is(err, errCoreGone), errors.Is(rt.bodyErr, errCoreGone):
		return metrics.KindReset
	case rt.clientGone, rt.bodyErr != nil:
		return metrics.KindCanceled
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return metrics.KindTimeout
	case errors.Is(err, syscall.ECONNREFUSED):
		return metrics.KindRefused
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return metrics.KindReset
	}
	return metrics.KindOther
}

// upstreamError is ReverseProxy's ErrorHandler: it answers and counts as failure says.
func (rt *route) upstreamError(w http.ResponseWriter, r *http.Request, err error) {
	rec, _ := w.(*recorder)
	f := failure(err, roundTrip{bodyErr: exchangeOf(r).requestFailed(), clientGone: r.Context().Err() != nil,
		chunked: r.TransferEncoding != nil, bodyIdle: rt.bodyIdle, upstreamTimeout: rt.upstreamTimeout})
	if f.kind != "" {
		rt.metrics.UpstreamError(f.kind)
	}
	if f.peer != "" {
		rt.metrics.BodyTimeout(f.peer)
	}
	if f.log {
		rt.logUpstream(f.kind, err)
	}
	if f.status == 0 {
		if rec != nil {
			abort(rec)
		}
		return
	}
	writeError(w, f.status, f.msg)
	if rec != nil && f.counted != 0 {
		rec.status = f.counted
	}
}

// isTLS reports whether err comes from the TLS handshake with Core. crypto/tls reports
// Core's alert over TCP as a *net.OpError "remote error" (tls.AlertError is QUIC's).
func isTLS(err error) bool {
	var cv *tls.CertificateVerificationError
	var alert tls.AlertError
	var rec tls.RecordHeaderError
	var op *net.OpError
	return errors.As(err, &cv) || errors.As(err, &alert) || errors.As(err, &rec) ||
		(errors.As(err, &op) && op.Op == "remote error")
}

func isDial(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}
