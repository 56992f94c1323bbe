package proxy

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/mdproxy/mdproxy/metrics"
)

// TestFailure: each error of a round trip to Core, with what is known of the client's
// side, maps to the client's status and Core-style message and to what is counted.
func TestFailure(t *testing.T) {
	const idle, header = 7 * time.Second, 30 * time.Second
	dialTimeout := &net.OpError{Op: "dial", Err: os.ErrDeadlineExceeded}
	readTimeout := &net.OpError{Op: "read", Err: os.ErrDeadlineExceeded}
	for _, tc := range []struct {
		name string
		err  error
		rt   roundTrip
		want failed
	}{
		{"client stalled its upload", errClientIdle, roundTrip{bodyErr: errClientIdle},
			failed{status: 408, msg: "The request body made no progress for 7s.", peer: metrics.PeerClient}},
		{"client gone", context.Canceled, roundTrip{clientGone: true},
			failed{kind: metrics.KindCanceled}},
		{"upload cut short", io.ErrUnexpectedEOF, roundTrip{bodyErr: io.ErrUnexpectedEOF},
			failed{status: 400, counted: 499, msg: "The request body ended before its Content-Length.", kind: metrics.KindCanceled}},
		{"chunked upload malformed", io.ErrUnexpectedEOF, roundTrip{bodyErr: io.ErrUnexpectedEOF, chunked: true},
			failed{status: 400, counted: 499, msg: "The request body's chunked encoding is malformed or ended early.", kind: metrics.KindCanceled}},
		{"Core gone under the upload", errCoreGone, roundTrip{bodyErr: errCoreGone},
			failed{status: 502, msg: "Core could not be reached: reset.", kind: metrics.KindReset, log: true}},
		{"connect timeout", dialTimeout, roundTrip{},
			failed{status: 502, msg: "Core could not be reached: connect timeout.", kind: metrics.KindTimeout, log: true}},
		{"Core stopped reading", readTimeout, roundTrip{},
			failed{status: 504, msg: "Core made no progress on the request for 7s.", kind: metrics.KindTimeout, peer: metrics.PeerCore, log: true}},
		{"no headers in time", fmt.Errorf("net/http: timeout awaiting response headers: %w", context.DeadlineExceeded), roundTrip{},
			failed{status: 504, msg: "Core did not answer within 30s.", kind: metrics.KindTimeout, log: true}},
		{"refused", &net.OpError{Op: "dial", Err: syscall.ECONNREFUSED}, roundTrip{},
			failed{status: 502, msg: "Core could not be reached: refused.", kind: metrics.KindRefused, log: true}},
		{"reset", syscall.ECONNRESET, roundTrip{},
			failed{status: 502, msg: "Core could not be reached: reset.", kind: metrics.KindReset, log: true}},
		{"TLS not verified", &tls.CertificateVerificationError{Err: x509.UnknownAuthorityError{}}, roundTrip{},
			failed{status: 502, msg: "Core could not be reached: TLS handshake failed (see mdproxy's log).", kind: metrics.KindOther, log: true}},
		{"submission's answer cut", &acceptedCutError{io.ErrUnexpectedEOF}, roundTrip{},
			failed{status: 502, msg: "Core accepted the file (200) but its answer broke off before the data_id: the scan may be running.", kind: metrics.KindReset, log: true}},
		{"invalid status", &badStatusError{999}, roundTrip{},
			failed{status: 502, msg: "Core's answer has an invalid status (999).", kind: metrics.KindOther, log: true}},
		{"protocol switch", errors.New("backend tried to switch protocol \"websocket\" when \"\" was requested"), roundTrip{},
			failed{status: 502, msg: "Core switched protocols (101): Core's API has no protocol upgrade, so none is relayed.", kind: metrics.KindOther, log: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.rt.bodyIdle, tc.rt.upstreamTimeout = idle, header
			if got := failure(tc.err, tc.rt); got != tc.want {
				t.Errorf("failure(%v, %+v) = %+v, want %+v", tc.err, tc.rt, got, tc.want)
			}
		})
	}
}
