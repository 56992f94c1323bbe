package limiter

import (
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
)

// TestClientViewsBounded: a replica keeps at most its bound of clients' views; a view
// expires when its tat passes (the reset after of the answer that brought it), and
// once the bound is reached the expired ones are freed, at most once a second, to make
// room; within one generation a view keeps the furthest tat seen.
func TestClientViewsBounded(t *testing.T) {
	clock := clockwork.NewFakeClockAt(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC))
	c := newClientViews(3, clock)
	ahead := func(tat, gen int64, d time.Duration) gcraResult {
		return gcraResult{allowed: true, resetAfter: d, view: view{tat: tat, gen: gen}}
	}
	c.put(1, ahead(100, 7, time.Second))
	c.put(2, ahead(200, 7, 3*time.Second))
	c.put(3, ahead(300, 7, 3*time.Second))
	c.put(4, ahead(400, 7, 3*time.Second)) // beyond the bound: not kept
	c.put(5, ahead(500, 7, 0))             // a full bucket: nothing to keep
	if n := c.len(); n != 3 {
		t.Fatalf("views held = %d, want the bound, 3", n)
	}
	if v := c.get(4); v != (view{}) {
		t.Errorf("get(4) = %+v, want none (not kept)", v)
	}
	c.put(2, ahead(150, 7, time.Second)) // an older answer of the same generation
	if v := c.get(2); v != (view{tat: 200, gen: 7}) {
		t.Errorf("get(2) after an older answer = %+v, want the furthest, {200 7}", v)
	}
	c.put(2, ahead(50, 8, time.Second)) // a new generation: replaced
	if v := c.get(2); v != (view{tat: 50, gen: 8}) {
		t.Errorf("get(2) of a new generation = %+v, want {50 8}", v)
	}
	clock.Advance(time.Second) // 1 and 2 (of its new generation) expire
	if v := c.get(1); v != (view{}) {
		t.Errorf("get(1) once its tat passed = %+v, want none (expired)", v)
	}
	c.put(6, ahead(600, 7, time.Second)) // the bound reached: the expired are freed
	if v := c.get(6); v != (view{tat: 600, gen: 7}) || c.len() != 2 {
		t.Errorf("get(6) = %+v with %d views, want {600 7} with 2 (1 and 2 freed)", v, c.len())
	}
	c.put(8, ahead(800, 7, time.Second))
	clock.Advance(500 * time.Millisecond)
	c.put(7, ahead(700, 7, time.Second))
	if v := c.get(7); v != (view{}) {
		t.Errorf("get(7) half a second after the last sweep = %+v, want none (bound reached)", v)
	}
	clock.Advance(500 * time.Millisecond) // 6 and 8 expire
	c.put(7, ahead(700, 7, time.Second))
	if v := c.get(7); v != (view{tat: 700, gen: 7}) || c.len() != 2 {
		t.Errorf("get(7) a second after the last sweep = %+v with %d views, want {700 7} with 2 (3 and 7)", v, c.len())
	}
}
