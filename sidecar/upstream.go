package sidecar

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// upstreamCheck asks Core's /readyz, through the proxy's transport to Core (its TLS
// settings and dial timeout), whether Core can be reached: any HTTP answer, whatever
// its status, is reachable (a Core busy or starting answers 503, and says so itself to
// whoever asks its /readyz through the proxy); no answer within
// MDPROXY_UPSTREAM_DIAL_TIMEOUT is not. It keeps mdproxy_upstream_up and logs each
// change: a warning when Core cannot be reached (at start too: every request is then
// answered 502), info when it can again. It never changes mdproxy's own /readyz,
// which would take every replica out of a Service at once, and flap with Core.
type upstreamCheck struct {
	url     string // Core's /readyz
	client  *http.Client
	up      prometheus.Gauge
	log     *slog.Logger
	timeout time.Duration
}

// startUpstreamCheck checks Core at once, then every interval, in a goroutine of its
// own: start-up does not wait for it. Each check has timeout. The returned stop ends
// the goroutine and waits for it.
func startUpstreamCheck(upstream *url.URL, tr http.RoundTripper, interval, timeout time.Duration, up prometheus.Gauge, log *slog.Logger) (stop func()) {
	c := &upstreamCheck{url: upstream.JoinPath("readyz").String(), client: &http.Client{Transport: tr,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }},
		up: up, log: log, timeout: timeout}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(interval)
		defer t.Stop()
		was, err := c.check(ctx)
		if !was && ctx.Err() == nil {
			c.log.Warn("Core cannot be reached at start: requests are answered 502 until it can (mdproxy_upstream_up is 0)",
				"upstream", upstream.Redacted(), "check", c.url, "error", err.Error())
		}
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			now, err := c.check(ctx)
			switch {
			case ctx.Err() != nil:
				return
			case was && !now:
				c.log.Warn("Core cannot be reached: requests are answered 502 until it can (mdproxy_upstream_up is 0)",
					"upstream", upstream.Redacted(), "check", c.url, "error", err.Error())
			case !was && now:
				c.log.Info("Core can be reached again", "upstream", upstream.Redacted())
			}
			was = now
		}
	}()
	return func() { cancel(); <-done }
}

// check asks Core once and, unless ctx ended, sets the gauge. It reports whether Core
// answered, and the error when it did not.
func (c *upstreamCheck) check(ctx context.Context) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.url, nil)
	if err != nil {
		return false, err
	}
	resp, err := c.client.Do(req)
	if err != nil {
		if !errors.Is(ctx.Err(), context.Canceled) {
			c.up.Set(0)
		}
		return false, err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	c.up.Set(1)
	return true, nil
}
