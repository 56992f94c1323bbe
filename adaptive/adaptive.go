// Package adaptive sets the rate of mdproxy's limited routes from Core's own scan queue:
// every interval it reads Core's GET /stat/nodes and moves each route's rate between
// its floor and its configured rate, the ceiling, by additive increase while the queue's
// occupancy is under the target and multiplicative decrease above it or when Core
// answered 503 itself (docs/adaptive.md). It never raises a rate without a reading.
package adaptive

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"time"

	"github.com/jonboulle/clockwork"
)

// The policy's steps: a rate rises by Increase of its ceiling an interval and falls to
// Decrease of itself.
const (
	Increase = 0.1
	Decrease = 0.5
)

// HoldIntervals is how many intervals without a reading of Core's statistics the rates
// hold before they return to their ceilings, the configured rates.
const HoldIntervals = 12

// Route is a limited route as the controller sees it at a step.
type Route struct {
	Name           string
	Floor, Ceiling float64 // requests per second; 0 < Floor <= Ceiling
	// InForce is the rate the route's bucket runs at now, in requests per second; 0
	// when unknown. A bucket built anew (a reload that changed the route's limit) runs
	// at its ceiling, whatever the controller set before.
	InForce float64
}

// Next returns the rate after one interval at rate, given Core's queue occupancy (0 to
// 1) and whether Core answered 503 since the last step: Decrease of rate (not under
// r.Floor) when occupancy is over target or Core refused, else Increase of r.Ceiling
// more (not over it).
func Next(r Route, rate, occupancy, target float64, refused bool) float64 {
	if occupancy > target || refused {
		return max(rate*Decrease, r.Floor)
	}
	return min(rate+r.Ceiling*Increase, r.Ceiling)
}

// Stats reads Core's queue occupancy from GET /stat/nodes.
type Stats struct {
	Client *http.Client // with its timeout; its Transport is Core's
	URL    string       // Core's base URL
	APIKey string       // sent as the apikey header; never logged
}

// errNoNodes is a /stat/nodes answer without a node.
var errNoNodes = errors.New("Core's /stat/nodes lists no node")

// Occupancy returns the share of Core's scan queue in use, 0 to 1: over every node, the
// files in the queue over those and the slots still free (scan_queue_details), or, from
// a Core that does not give them, the nodes' CPU load (load, percent) over 100. An error
// says why it could not be read: Core unreachable, a status other than 200 (401 or 403:
// the apikey), an answer that is not the description's JSON.
func (s Stats) Occupancy(ctx context.Context) (float64, error) {
	u, err := url.JoinPath(s.URL, "stat", "nodes")
	if err != nil {
		return 0, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return 0, err
	}
	req.Header.Set("apikey", s.APIKey)
	resp, err := s.Client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("Core's /stat/nodes answered %d", resp.StatusCode)
	}
	var nodes []struct {
		Statuses []struct {
			Load    *float64 `json:"load"`
			Details *struct {
				Total     *float64 `json:"total_scan_queue"`
				Available *float64 `json:"available_slots"`
			} `json:"scan_queue_details"`
		} `json:"statuses"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&nodes); err != nil {
		return 0, fmt.Errorf("Core's /stat/nodes: %w", err)
	}
	var used, slots, load float64
	n, detailed := 0, true
	for _, in := range nodes {
		for _, st := range in.Statuses {
			n++
			if d := st.Details; d != nil && d.Total != nil && d.Available != nil {
				used, slots = used+*d.Total, slots+*d.Total+*d.Available
			} else {
				detailed = false
			}
			if st.Load != nil {
				load += *st.Load
			}
		}
	}
	switch {
	case n == 0:
		return 0, errNoNodes
	case detailed && slots > 0:
		return used / slots, nil
	case detailed:
		return 0, nil
	}
	return min(max(load/float64(n)/100, 0), 1), nil
}

// Core is what the controller reads of Core: its queue occupancy (Stats.Occupancy) and
// how many times it answered 503 so far (a counter: mdproxy's metrics).
type Core interface {
	Occupancy(ctx context.Context) (float64, error)
	Refused() float64
}

// Limits are the limited routes now, with their floors and ceilings, and the way to put
// a rate in force on one.
type Limits interface {
	Routes() []Route
	Apply(route string, rate float64)
}

// Recorder counts what the controller reads and does (metrics).
type Recorder interface {
	Occupied(occupancy float64)                    // each reading
	Failed()                                       // each step without a reading
	Leading(lead bool)                             // each step: whether this replica leads (reads Core); false without Redis's answer
	Rate(route string, rate float64, atFloor bool) // each route's rate at each step (in a dry run, the rate it would set)
	Adjusted(route, direction string)              // each change: up, down or reset
}

// Controller moves the rates of Limits' routes from Core's readings, by Next, towards
// Target (0 to 1). In a dry run it computes and records the rates and puts none in
// force. With a Fleet, only the replica that leads reads Core and computes the rates;
// the others put the rates it published in force, and a step without them (Redis
// unreachable, no leader) counts as one without a reading. Its methods are called from
// one goroutine (Run).
type Controller struct {
	Core     Core
	Limits   Limits
	Recorder Recorder
	Target   float64
	DryRun   bool
	Log      *slog.Logger
	Fleet    *Fleet // nil: this replica's rates are its own

	rates       map[string]float64 // the rate of each route as last set or computed
	lastRefused float64
	failures    int  // readings failed in a row
	leading     bool // with a Fleet: this replica led at its last step
}

// errNoRates is a follower's step when no leader has published rates.
var errNoRates = errors.New("no replica published the rates on Redis (no leader)")

// Step runs one interval: reads Core's statistics and moves each route's rate (with a
// Fleet, as the leader, or puts the leader's rates in force), or, without a reading,
// holds the rates, and returns them to their ceilings after HoldIntervals steps without
// one in a row. The first failure of a run of them and the reading after it are logged,
// once each.
func (c *Controller) Step(ctx context.Context) {
	if c.rates == nil {
		c.rates = map[string]float64{}
	}
	refusedNow := c.Core.Refused()
	refused := int64(refusedNow - c.lastRefused)
	c.lastRefused = refusedNow
	routes := c.Limits.Routes()
	lead := true
	if c.Fleet != nil {
		var others int64
		var err error
		if lead, others, err = c.Fleet.Lead(ctx); err != nil {
			c.Recorder.Leading(false) // it reads no Core without the lease
			c.leading = false
			c.failed(routes, fmt.Errorf("Redis: %w", err))
			return
		}
		c.Recorder.Leading(lead)
		if lead != c.leading {
			c.leading = lead
			if lead {
				c.Log.Info("adaptive limit: this replica now reads Core and sets the fleet's rates (it holds the lease on Redis)")
			} else {
				c.Log.Info("adaptive limit: this replica now follows the rates another one publishes on Redis")
			}
		}
		if !lead {
			c.follow(ctx, routes, refused)
			return
		}
		refused += others
	} else {
		c.Recorder.Leading(true)
	}
	occupancy, err := c.Core.Occupancy(ctx)
	if err != nil {
		c.failed(routes, err)
		return
	}
	c.readAgain()
	c.Recorder.Occupied(occupancy)
	for _, r := range routes {
		rate := c.rateOf(r)
		c.move(r, rate, Next(r, rate, occupancy, c.Target, refused > 0))
	}
	if c.Fleet != nil {
		if err := c.Fleet.Publish(ctx, c.rates, occupancy); err != nil {
			c.Log.Warn("adaptive limit: the rates could not be published on Redis; the other replicas hold theirs", "err", err.Error())
		}
	}
}

// follow puts in force the rates the Fleet's leader published, reporting refused, the
// 503s Core gave this replica since its last step.
func (c *Controller) follow(ctx context.Context, routes []Route, refused int64) {
	rates, occupancy, err := c.Fleet.Follow(ctx, refused)
	if err == nil && rates == nil {
		err = errNoRates
	}
	if err != nil {
		c.failed(routes, err)
		return
	}
	c.readAgain()
	c.Recorder.Occupied(occupancy)
	for _, r := range routes {
		if next, ok := rates[r.Name]; ok { // else a route the leader does not limit yet: a reload under way
			c.move(r, c.rateOf(r), min(max(next, r.Floor), r.Ceiling))
		}
	}
}

// failed records a step without a reading, for err.
func (c *Controller) failed(routes []Route, err error) {
	c.failures++
	c.Recorder.Failed()
	if c.failures == 1 {
		c.Log.Warn("adaptive limit: Core's statistics cannot be read; the rates hold, and return to the configured ones if this lasts",
			"err", err.Error(), "hold_intervals", HoldIntervals)
	}
	if c.failures == HoldIntervals {
		for _, r := range routes {
			c.set(r, r.Ceiling, "reset")
		}
	}
}

// readAgain ends a run of steps without a reading, saying so once.
func (c *Controller) readAgain() {
	if c.failures > 0 {
		c.Log.Info("adaptive limit: Core's statistics read again", "failed_readings", c.failures)
		c.failures = 0
	}
}

// rateOf returns r's rate as last set, within its bounds (a reload may have moved them).
func (c *Controller) rateOf(r Route) float64 {
	rate, ok := c.rates[r.Name]
	if !ok {
		rate = r.Ceiling
	}
	return min(max(rate, r.Floor), r.Ceiling)
}

// move sets r's rate from rate to next, counted by direction when it changes, and puts
// it in force again when the route's bucket runs at another (r.InForce).
func (c *Controller) move(r Route, rate, next float64) {
	switch {
	case next < rate:
		c.set(r, next, "down")
	case next > rate:
		c.set(r, next, "up")
	default:
		c.rates[r.Name] = next
		c.Recorder.Rate(r.Name, next, next <= r.Floor)
		if !c.DryRun && r.InForce > 0 && r.InForce != next {
			c.Limits.Apply(r.Name, next) // the bucket was built anew at its ceiling
		}
	}
}

func (c *Controller) set(r Route, rate float64, direction string) {
	c.rates[r.Name] = rate
	c.Recorder.Rate(r.Name, rate, rate <= r.Floor)
	c.Recorder.Adjusted(r.Name, direction)
	if !c.DryRun {
		c.Limits.Apply(r.Name, rate)
	}
}

// Run calls Step every interval on clock until ctx ends; with a Fleet, it then gives up
// the lease if it holds it, so that another replica leads at once.
func (c *Controller) Run(ctx context.Context, clock clockwork.Clock, interval time.Duration) {
	t := clock.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			if c.Fleet != nil {
				if err := c.Fleet.Resign(context.WithoutCancel(ctx)); err != nil {
					c.Log.Warn("adaptive limit: the lease on Redis could not be given up; it expires in three intervals", "err", err.Error())
				}
			}
			return
		case <-t.Chan():
			sctx, cancel := context.WithTimeout(ctx, interval)
			c.Step(sctx)
			cancel()
		}
	}
}
