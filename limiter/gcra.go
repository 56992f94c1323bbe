package limiter

import (
	"math"
	"time"
)

// gcra is the limit of a token bucket kept as the generic cell rate algorithm keeps
// one: by the theoretical arrival time (tat) of the next request, in integer
// nanoseconds on the bucket's own time line (see Bucket.now), the same arithmetic as
// the Redis GCRA of RedisBucket. The route's bucket holds one tat, a per-client share one
// per client key. A request at now finds its token free max(tat, now) + interval -
// burst*interval - now from now; taking it moves tat one interval on. It is
// x/time/rate's token bucket (refill at rate, at most burst tokens, starts full) with
// one difference that the queue of waiting requests needs: the last token taken is given
// back exactly, by moving tat one interval back, however many are given back in a row.
// x/time/rate's Reservation.CancelAt restores tokens from float64 durations, and the
// turns of reservations taken while the bucket held a fraction of a token are an
// interval apart only to within a nanosecond: after a first cancel, the next ones in a
// row restore nearly nothing, and the route loses those tokens
// (TestCanceledWaitersTogether).
//
// A token is only ever taken when its turn is within the bucket's burst and the wait it
// allows, so tat is never more than ceiling ahead of the instant it was taken at. A
// clock stepped back breaks that (tat is then ahead by the step too): clamp pulls tat
// back to now + ceiling, so that a step back of the clock never refuses for longer than
// a full refill and the wait, instead of for the step.
//
// A gcra is a value that never changes; the tats it works on are guarded by their
// owner (Bucket's mutex, the share's).
type gcra struct {
	interval    int64 // nanoseconds a token takes to come back: 1/rate, at least 1
	burstOffset int64 // burst*interval, saturated at maxOffset
	ceiling     int64 // burstOffset plus the longest wait: how far ahead tat may be
}

// maxOffset bounds a bucket's burst offset and wait, in nanoseconds (about 73 years
// each), so that a tat, now and the offsets sum without overflow.
const maxOffset = int64(math.MaxInt64 / 4)

// newGCRA returns the limit of a bucket of burst tokens refilled one each interval
// nanoseconds (at least 1; burst >= 1), whose requests wait at most maxWait (>= 0) for
// a token. A tat of 0, or any at or before now, is a full bucket.
func newGCRA(interval int64, burst int, maxWait time.Duration) gcra {
	interval = max(interval, 1)
	offset := maxOffset
	if int64(burst) < offset/interval {
		offset = int64(burst) * interval
	}
	return gcra{interval: interval, burstOffset: offset, ceiling: offset + min(int64(maxWait), maxOffset)}
}

// routeGCRA is the limit of a route's bucket: burst tokens at rate tokens per second
// (rate > 0), an interval rounded to the nanosecond, requests waiting at most maxWait.
func routeGCRA(rate float64, burst int, maxWait time.Duration) gcra {
	return newGCRA(int64(math.Round(float64(time.Second)/rate)), burst, maxWait)
}

// clientGCRA is the limit of a per-client share: limit requests per window (limit >=
// 1, window > 0) with a burst of limit and no wait. The interval is window/limit
// rounded up, so that the share never admits more than its stated bound in a window
// (at most 2*limit-1 in any window of its length; see Limit.ClientLimit).
func clientGCRA(limit int, window time.Duration) gcra {
	return newGCRA((int64(window)+int64(limit)-1)/int64(limit), limit, 0)
}

// clamp returns tat pulled back to now + ceiling if it is further ahead: only a clock
// stepped back puts it there.
func (g gcra) clamp(tat, now int64) int64 {
	return min(tat, now+g.ceiling)
}

// delay is how long a request at now waits for its token given tat: 0 or less when
// one is free.
func (g gcra) delay(tat, now int64) time.Duration {
	return time.Duration(max(tat, now) + g.interval - g.burstOffset - now)
}

// quota returns the whole tokens left at now given tat, and the time until the bucket is
// full.
func (g gcra) quota(tat, now int64) (remaining int, full time.Duration) {
	debt := max(tat-now, 0)
	return int(max(g.burstOffset-debt, 0) / g.interval), time.Duration(debt)
}

// take returns tat once a request at now took the next token.
func (g gcra) take(tat, now int64) int64 {
	return max(tat, now) + g.interval
}

// giveBack returns tat once the last token taken was given back, unused: that of a
// request that gave up waiting for it, or that the route refused after its client's
// share counted it.
func (g gcra) giveBack(tat int64) int64 {
	return tat - g.interval
}
