package proxy

import (
	"net"
	"net/http"
	"time"
)

// TransportOptions tunes NewTransport. Each zero field takes the default given.
type TransportOptions struct {
	// DialTimeout bounds connecting to Core. Default 5 s.
	DialTimeout time.Duration
	// ResponseHeaderTimeout bounds the wait for Core's response headers after the
	// request, body included, was sent; past it the client gets 504. Default 60 s.
	// Uploads are never cut by it: it starts once the body is written.
	ResponseHeaderTimeout time.Duration
	// IdleConnTimeout closes kept-alive connections to Core idle that long. Default 90 s.
	IdleConnTimeout time.Duration
	// MaxIdleConnsPerHost is the number of idle connections kept to Core. Default 256,
	// enough for a fleet of pollers without a new connection each poll.
	MaxIdleConnsPerHost int
}

// NewTransport returns the http.Transport to Core: explicit timeouts, no proxy from the
// environment (a sidecar talks to its Core directly), no transparent compression (bodies
// pass as they are), Expect: 100-continue honoured for a second so Core can refuse an
// upload before its body is sent.
func NewTransport(o TransportOptions) *http.Transport {
	if o.DialTimeout == 0 {
		o.DialTimeout = 5 * time.Second
	}
	if o.ResponseHeaderTimeout == 0 {
		o.ResponseHeaderTimeout = 60 * time.Second
	}
	if o.IdleConnTimeout == 0 {
		o.IdleConnTimeout = 90 * time.Second
	}
	if o.MaxIdleConnsPerHost == 0 {
		o.MaxIdleConnsPerHost = 256
	}
	return &http.Transport{
		Proxy:                 nil,
		DialContext:           (&net.Dialer{Timeout: o.DialTimeout, KeepAlive: 30 * time.Second}).DialContext,
		ForceAttemptHTTP2:     false,
		MaxIdleConns:          o.MaxIdleConnsPerHost,
		MaxIdleConnsPerHost:   o.MaxIdleConnsPerHost,
		IdleConnTimeout:       o.IdleConnTimeout,
		ResponseHeaderTimeout: o.ResponseHeaderTimeout,
		ExpectContinueTimeout: time.Second,
		TLSHandshakeTimeout:   o.DialTimeout,
		DisableCompression:    true,
	}
}
