package bench

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// watchEvery is the real time between two samples of a case's watch.
const watchEvery = 100 * time.Millisecond

// adaptiveTarget is mdproxy's default MDPROXY_ADAPTIVE_TARGET, the share of Core's scan
// queue above which the adaptive limit lowers the rates; the watch counts the time
// Core's queue spends above it. TestAdaptiveDefaults checks it against sidecar's.
const adaptiveTarget = 0.8

// watch samples, while a case runs, what the client does not see: the emulator's scan
// queue (read in-process, which costs the model nothing, unlike GET /stat/nodes) and, in
// the Adaptive case, file_result's rate in force in mdproxy (from its /metrics). A nil
// watch samples nothing.
type watch struct {
	queueLen  func() int
	queueSize int
	speedup   float64
	// metricsURL is mdproxy's /metrics in the Adaptive case, else empty.
	metricsURL string
	ceiling    float64 // file_result's configured rate, requests per real second
}

// watched is what a watch saw.
type watched struct {
	samples, overTarget int     // queue samples; those above adaptiveTarget of the queue
	peakQueue           int     // files waiting, at most
	rateSum             float64 // file_result's rate in force, requests per real second
	rateN, belowCeiling int     // rate samples; those under the ceiling
}

// start samples every watchEvery until the function it returns is called, which returns
// what it saw.
func (w *watch) start() func() watched {
	if w == nil {
		return func() watched { return watched{} }
	}
	ctx, cancel := context.WithCancel(context.Background())
	var seen watched
	var wg sync.WaitGroup
	wg.Go(func() {
		client := &http.Client{Timeout: time.Second}
		defer client.CloseIdleConnections()
		t := time.NewTicker(watchEvery)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			q := w.queueLen()
			seen.samples++
			seen.peakQueue = max(seen.peakQueue, q)
			if float64(q) > adaptiveTarget*float64(w.queueSize) {
				seen.overTarget++
			}
			if w.metricsURL == "" {
				continue
			}
			if r, err := scrapeRate(ctx, client, w.metricsURL); err == nil {
				seen.rateSum += r
				seen.rateN++
				if r < w.ceiling*0.999 {
					seen.belowCeiling++
				}
			}
		}
	})
	return func() watched {
		cancel()
		wg.Wait()
		return seen
	}
}

// fill sets f's figures of what w saw (in virtual time); none when it saw nothing.
func (w *watch) fill(f *Figures, s watched) {
	if w == nil || s.samples == 0 {
		return
	}
	sampleMin := watchEvery.Minutes() * w.speedup
	peak, over := float64(s.peakQueue)/float64(w.queueSize), float64(s.overTarget)*sampleMin
	f.PeakQueueShare, f.QueueOverTargetMin = &peak, &over
	if s.rateN > 0 {
		mean := s.rateSum / float64(s.rateN) / w.speedup
		below := float64(s.belowCeiling) * sampleMin
		f.AdaptiveRateMean, f.AdaptiveBelowCeilingMin = &mean, &below
	}
}

// scrapeRate reads file_result's rate in force (mdproxy_limit_rate_requests_per_second)
// from mdproxy's /metrics at url.
func scrapeRate(ctx context.Context, c *http.Client, url string) (float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("%s: %s", url, resp.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return 0, err
	}
	for _, m := range mfs["mdproxy_limit_rate_requests_per_second"].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "route" && l.GetValue() == "file_result" {
				return m.GetGauge().GetValue(), nil
			}
		}
	}
	return 0, fmt.Errorf("%s: no file_result rate", url)
}

// freeLoopbackAddr returns a loopback address whose port was free a moment ago, for a
// listener whose address must be known before it starts (mdproxy's admin listener in
// the Adaptive case).
func freeLoopbackAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}
