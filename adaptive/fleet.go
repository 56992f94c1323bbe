package adaptive

import (
	"context"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// Fleet is how the replicas of mdproxy on one Redis hold one rate per route: one
// replica at a time, the leader, holds a lease, reads Core and publishes the rates; the
// others put the published rates in force and report the 503s Core gave them, which the
// leader counts at its next step. A leader that stops resigns; one that dies loses the
// lease when it expires, three intervals after its last renewal, and the next replica to
// step takes it, starting from the rates it had followed. Safe for concurrent use.
type Fleet struct {
	rdb                redis.UniversalClient
	lease, rates, busy string // keys: the lease, the published rates (a hash), the followers' 503s
	id                 string // this replica's value of the lease
	ttl, timeout       time.Duration
}

// occupancyField is the field of the rates' hash that holds Core's queue occupancy as the
// leader last read it; route names are lower case words, never this.
const occupancyField = "_occupancy"

// leaseScript takes the lease (KEYS[1]) when it is free or already this replica's
// (ARGV[1]), for ARGV[2] ms, and then takes the count of Core's 503s the followers
// reported (KEYS[2]): it returns that count, or -1 when another replica holds the lease.
var leaseScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v == false or v == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  local busy = redis.call('GET', KEYS[2])
  redis.call('DEL', KEYS[2])
  return tonumber(busy) or 0
end
return -1`)

// resignScript deletes the lease (KEYS[1]) when it is this replica's (ARGV[1]).
var resignScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0`)

// NewFleet returns the replicas' coordination on rdb, under keys starting with prefix
// (MDPROXY_REDIS_PREFIX), for controllers stepping every interval: id names this replica,
// unique among them; timeout bounds each call to Redis (MDPROXY_REDIS_TIMEOUT).
func NewFleet(rdb redis.UniversalClient, prefix, id string, interval, timeout time.Duration) *Fleet {
	return &Fleet{rdb: rdb, lease: prefix + "adaptive:lease", rates: prefix + "adaptive:rates",
		busy: prefix + "adaptive:busy", id: id, ttl: 3 * interval, timeout: timeout}
}

// Lead takes or renews the lease and reports whether this replica holds it and, when it
// does, how many of Core's 503s the followers reported since its last call.
func (f *Fleet) Lead(ctx context.Context) (lead bool, refused int64, err error) {
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	n, err := leaseScript.Run(ctx, f.rdb, []string{f.lease, f.busy}, f.id, f.ttl.Milliseconds()).Int64()
	if err != nil {
		return false, 0, err
	}
	return n >= 0, max(n, 0), nil
}

// Resign gives the lease up when this replica holds it, so that another leads at its
// next step.
func (f *Fleet) Resign(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	return resignScript.Run(ctx, f.rdb, []string{f.lease}, f.id).Err()
}

// Publish writes the rates and Core's occupancy, which expire with the lease.
func (f *Fleet) Publish(ctx context.Context, rates map[string]float64, occupancy float64) error {
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	fields := make([]any, 0, 2*len(rates)+2)
	for route, r := range rates {
		fields = append(fields, route, strconv.FormatFloat(r, 'g', -1, 64))
	}
	fields = append(fields, occupancyField, strconv.FormatFloat(occupancy, 'g', -1, 64))
	_, err := f.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Del(ctx, f.rates)
		p.HSet(ctx, f.rates, fields...)
		p.PExpire(ctx, f.rates, f.ttl)
		return nil
	})
	return err
}

// Follow reports refused, Core's 503s since the last call (when above 0), to the leader
// and reads the published rates and occupancy; rates is nil when none are published
// (no leader, or its rates expired).
func (f *Fleet) Follow(ctx context.Context, refused int64) (rates map[string]float64, occupancy float64, err error) {
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	var all *redis.MapStringStringCmd
	_, err = f.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		if refused > 0 {
			p.IncrBy(ctx, f.busy, refused)
			p.PExpire(ctx, f.busy, f.ttl)
		}
		all = p.HGetAll(ctx, f.rates)
		return nil
	})
	if err != nil {
		return nil, 0, err
	}
	for k, v := range all.Val() {
		x, perr := strconv.ParseFloat(v, 64)
		switch {
		case perr != nil:
		case k == occupancyField:
			occupancy = x
		default:
			if rates == nil {
				rates = map[string]float64{}
			}
			rates[k] = x
		}
	}
	return rates, occupancy, nil
}
