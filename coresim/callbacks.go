package coresim

import (
	"bytes"
	"container/heap"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-chi/chi/v5"
)

// validCallbackURL reports whether s is a callback URL Core can use:
// <http|https>://<host>[:port][/path] (docs/core-api.md, "Callbacks"), a port, when
// given, of 1 to 65535, and only characters a URI holds (no space or control
// character). A query is let through, as webhook URLs often carry one.
func validCallbackURL(s string) bool {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Hostname() == "" {
		return false
	}
	if p := u.Port(); p != "" || strings.HasSuffix(u.Host, ":") {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return false
		}
	}
	return !strings.ContainsFunc(s, func(r rune) bool { return r <= ' ' || r == 0x7f })
}

// hookStatus is a scan's callback delivery state (GET /file/webhook/{data_id}).
type hookStatus struct {
	url        string
	attempts   int
	statusCode int           // of the last attempt; 0 when it got no HTTP answer
	lastTry    time.Duration // virtual
	delivered  bool
	failed     bool // every retry used up
}

// delivery is one pending callback attempt, due at a virtual time.
type delivery struct {
	sc      *scan
	due     time.Duration
	attempt int // 1 for the first delivery
}

type dueHeap []*delivery

func (h dueHeap) Len() int           { return len(h) }
func (h dueHeap) Less(i, j int) bool { return h[i].due < h[j].due }
func (h dueHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *dueHeap) Push(x any)        { *h = append(*h, x.(*delivery)) }
func (h *dueHeap) Pop() any {
	old := *h
	d := old[len(old)-1]
	*h = old[:len(old)-1]
	return d
}

// callbacks delivers analysis results to callback URLs: POST of the result JSON once
// the scan completes, then, while it fails, retries after CallbackDelay, then each
// time CallbackIncrease later than the previous gap (Core's webhook settings: a number
// of retries, a first delay and a linear increase). Pending deliveries wait in a heap,
// not in goroutines; CallbackWorkers goroutines send them.
type callbacks struct {
	s      *Sim
	client *http.Client

	mu      sync.Mutex
	pending dueHeap
	ready   chan *delivery
}

func newCallbacks(s *Sim) *callbacks {
	return &callbacks{
		s:      s,
		client: &http.Client{Timeout: s.cfg.CallbackTimeout},
		ready:  make(chan *delivery, 4096),
	}
}

// schedule queues the first delivery of sc's result at virtual time at.
func (c *callbacks) schedule(sc *scan, at time.Duration) {
	c.mu.Lock()
	heap.Push(&c.pending, &delivery{sc: sc, due: at, attempt: 1})
	c.mu.Unlock()
	c.dispatch(c.s.model.Now())
}

// dispatch hands the deliveries due at virtual time now to the workers; those that do
// not fit the workers' queue wait for the next call.
func (c *callbacks) dispatch(now time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for c.pending.Len() > 0 && c.pending[0].due <= now {
		select {
		case c.ready <- c.pending[0]:
			heap.Pop(&c.pending)
		default:
			return
		}
	}
}

// work sends deliveries until ctx ends.
func (c *callbacks) work(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case d := <-c.ready:
			c.deliver(ctx, d)
		}
	}
}

// deliver makes one attempt and schedules the next one if it failed.
func (c *callbacks) deliver(ctx context.Context, d *delivery) {
	s := c.s
	res, _ := s.resultOf(d.sc)
	body, _ := json.Marshal(res)
	code := 0
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.sc.callbackURL, bytes.NewReader(body))
	if err == nil {
		req.Header.Set("Content-Type", "application/json")
		var resp *http.Response
		resp, err = c.client.Do(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
			resp.Body.Close()
			code = resp.StatusCode
		}
	}
	ok := err == nil && code >= 200 && code < 300
	now := s.model.Now()
	s.mu.Lock()
	h := d.sc.hook
	h.attempts = d.attempt
	h.statusCode = code
	h.lastTry = now
	h.delivered = ok
	retry := !ok && d.attempt <= s.cfg.CallbackRetries
	h.failed = !ok && !retry
	s.mu.Unlock()

	if ok {
		s.m.callbackAttempts.WithLabelValues("ok").Inc()
		s.m.callbacks.WithLabelValues("delivered").Inc()
		return
	}
	s.m.callbackAttempts.WithLabelValues("error").Inc()
	if !retry || ctx.Err() != nil {
		if !retry {
			s.m.callbacks.WithLabelValues("failed").Inc()
		}
		return
	}
	// Retry n (n = attempt) waits CallbackDelay + (n-1) × CallbackIncrease.
	gap := s.cfg.CallbackDelay + time.Duration(d.attempt-1)*s.cfg.CallbackIncrease
	c.mu.Lock()
	heap.Push(&c.pending, &delivery{sc: d.sc, due: now + gap, attempt: d.attempt + 1})
	c.mu.Unlock()
}

// webhookStatus is GET /file/webhook/{data_id}: the state of the callback delivery.
func (a *api) webhookStatus(w http.ResponseWriter, r *http.Request) {
	s := a.s
	sc := s.lookup(chi.URLParam(r, "data_id"))
	if sc == nil || sc.callbackURL == "" {
		writeErr(w, http.StatusNotFound, "Not found")
		return
	}
	s.mu.Lock()
	out := map[string]any{"data_id": sc.id, "url": sc.callbackURL, "status_code": 0, "request_time": ""}
	if h := sc.hook; h != nil && h.attempts > 0 {
		out["status_code"] = h.statusCode
		out["request_time"] = s.timestamp(h.lastTry)
		out["attempts"] = h.attempts
		out["delivered"] = h.delivered
	}
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, out)
}
