package limiter

import (
	"math"
	"time"
)

// gcra is a token bucket kept as the generic cell rate algorithm keeps one: by the
// theoretical arrival time (tat) of the next request, in integer nanoseconds of the
// bucket's clock, the same arithmetic as the Redis GCRA of RedisBucket. A request at now
// finds its token free max(tat, now) + interval - burst*interval - now from now; taking
// it moves tat one interval on. It is x/time/rate's token bucket (refill at rate, at
// most burst tokens, starts full) with one difference that the queue of waiting
// requests needs: the last token taken is given back exactly, by moving tat one
// interval back, however many are given back in a row. x/time/rate's
// Reservation.CancelAt restores tokens from float64 durations, and the turns of
// reservations taken while the bucket held a fraction of a token are an interval apart
// only to within a nanosecond: after a first cancel, the next ones in a row restore
// nearly nothing, and the route loses those tokens (TestCanceledWaitersTogether).
//
// A gcra is not safe for concurrent use: Bucket guards it with its mutex.
type gcra struct {
	interval    int64 // nanoseconds a token takes to come back: 1/rate, at least 1
	burstOffset int64 // burst*interval, saturated
	tat         int64 // Unix nanoseconds; at or before now: the bucket is full
}

// newGCRA returns a full bucket of burst tokens refilled at rate tokens per second
// (rate > 0, burst >= 1).
func newGCRA(rate float64, burst int) gcra {
	interval := int64(math.Round(float64(time.Second) / rate))
	interval = max(interval, 1)
	offset := int64(math.MaxInt64 / 4)
	if int64(burst) < offset/interval {
		offset = int64(burst) * interval
	}
	return gcra{interval: interval, burstOffset: offset}
}

// delay is how long a request at now waits for its token: 0 or less when one is free.
func (g *gcra) delay(now int64) time.Duration {
	return time.Duration(max(g.tat, now) + g.interval - g.burstOffset - now)
}

// take takes the next token for a request at now.
func (g *gcra) take(now int64) {
	g.tat = max(g.tat, now) + g.interval
}

// giveBack gives back the last token taken, which must not have been used: that of a
// request that gave up waiting for it.
func (g *gcra) giveBack() {
	g.tat -= g.interval
}
