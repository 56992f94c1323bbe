package proxy

import (
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"
)

// lazyPair returns the server's side of a loopback TCP connection accepted through
// LazyDeadlines(resolution) and the client's side, both closed by t.Cleanup.
func lazyPair(t *testing.T, resolution time.Duration) (*lazyConn, net.Conn) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := LazyDeadlines(l, resolution, 0)
	defer ln.Close()
	client, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	lc, ok := c.(*lazyConn)
	if !ok {
		t.Fatalf("LazyDeadlines accepted a %T, want *lazyConn", c)
	}
	return lc, client
}

// readResult is what a Read in another goroutine returned, and when.
type readResult struct {
	n   int
	err error
	at  time.Time
}

// wait returns what done receives, failing t after 10 s.
func wait(t *testing.T, done <-chan readResult) readResult {
	t.Helper()
	select {
	case r := <-done:
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("Read still waits after 10 s")
		return readResult{}
	}
}

func readAsync(c net.Conn, p []byte) <-chan readResult {
	done := make(chan readResult, 1)
	go func() {
		n, err := c.Read(p)
		done <- readResult{n, err, time.Now()}
	}()
	return done
}

// TestLazyDeadlinesNotEarly: deadlines in the future stay in memory (the socket gets
// none), and a Read returns os.ErrDeadlineExceeded at the deadline last set, not
// before, whether an earlier one was set first or not, and returns the bytes that come
// before it.
func TestLazyDeadlinesNotEarly(t *testing.T) {
	t.Parallel()
	c, client := lazyPair(t, 10*time.Millisecond)
	for _, first := range []time.Duration{0, 30 * time.Millisecond} {
		now := time.Now()
		if first > 0 {
			if err := c.SetReadDeadline(now.Add(first)); err != nil {
				t.Fatal(err)
			}
		}
		if err := c.SetReadDeadline(now.Add(300 * time.Millisecond)); err != nil {
			t.Fatal(err)
		}
		if c.past.Load() {
			t.Errorf("after %v: the socket's deadline is in the past, want none", first)
		}
		r := wait(t, readAsync(c, make([]byte, 8)))
		if !errors.Is(r.err, os.ErrDeadlineExceeded) {
			t.Fatalf("after %v: Read = %d, %v; want os.ErrDeadlineExceeded", first, r.n, r.err)
		}
		if early := now.Add(300 * time.Millisecond).Sub(r.at); early > 0 {
			t.Errorf("after %v: Read timed out %v before the deadline", first, early)
		}
	}

	// Bytes that come before the deadline are read, after an earlier deadline set.
	now := time.Now()
	if err := c.SetReadDeadline(now.Add(20 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	if err := c.SetReadDeadline(now.Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 8)
	done := readAsync(c, buf)
	time.Sleep(100 * time.Millisecond)
	if _, err := client.Write([]byte("late")); err != nil {
		t.Fatal(err)
	}
	if r := wait(t, done); r.err != nil || string(buf[:r.n]) != "late" {
		t.Errorf("Read = %q, %v; want \"late\", nil", buf[:r.n], r.err)
	}
}

// TestLazyDeadlinesSweep: a Read waiting with a deadline in the future returns
// os.ErrDeadlineExceeded once the deadline has passed (the listener's sweeper ends it),
// and a Read begun after it has passed returns at once.
func TestLazyDeadlinesSweep(t *testing.T) {
	t.Parallel()
	c, _ := lazyPair(t, 10*time.Millisecond)
	deadline := time.Now().Add(100 * time.Millisecond)
	if err := c.SetReadDeadline(deadline); err != nil {
		t.Fatal(err)
	}
	r := wait(t, readAsync(c, make([]byte, 8)))
	if !errors.Is(r.err, os.ErrDeadlineExceeded) {
		t.Fatalf("Read = %d, %v; want os.ErrDeadlineExceeded", r.n, r.err)
	}
	if r.at.Before(deadline) {
		t.Errorf("Read timed out %v before the deadline", deadline.Sub(r.at))
	}
	if r := wait(t, readAsync(c, make([]byte, 8))); !errors.Is(r.err, os.ErrDeadlineExceeded) {
		t.Errorf("Read after the deadline = %d, %v; want os.ErrDeadlineExceeded", r.n, r.err)
	}
}

// TestLazyDeadlinesNone: no deadline after one that has passed (as net/http does after
// ending its background read) leaves Read waiting for the bytes, however many of the
// sweeper's looks they take.
func TestLazyDeadlinesNone(t *testing.T) {
	t.Parallel()
	c, client := lazyPair(t, 20*time.Millisecond)
	if err := c.SetReadDeadline(aLongTimeAgo); err != nil {
		t.Fatal(err)
	}
	if r := wait(t, readAsync(c, make([]byte, 1))); !errors.Is(r.err, os.ErrDeadlineExceeded) {
		t.Fatalf("Read after a deadline in the past = %v, want os.ErrDeadlineExceeded", r.err)
	}
	if err := c.SetReadDeadline(time.Time{}); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 8)
	done := readAsync(c, buf)
	time.Sleep(150 * time.Millisecond)
	if _, err := client.Write([]byte("slow")); err != nil {
		t.Fatal(err)
	}
	if r := wait(t, done); r.err != nil || string(buf[:r.n]) != "slow" {
		t.Errorf("Read with no deadline = %q, %v; want \"slow\", nil", buf[:r.n], r.err)
	}
}

// TestLazyDeadlinesEndBlockedRead: a deadline at or before now, set by another
// goroutine, ends a Read that waits (net/http's abortPendingRead, the proxy's cut of a
// body Core no longer takes) at once, not at the sweeper's
// next look (an hour away here), whatever deadline the Read had; the next Read, with no
// deadline, reads. Many times over, for the race detector.
func TestLazyDeadlinesEndBlockedRead(t *testing.T) {
	t.Parallel()
	c, client := lazyPair(t, time.Hour)
	buf := make([]byte, 8)
	for i := range 200 {
		if err := c.SetReadDeadline(time.Now().Add(time.Duration(i%3) * time.Minute)); err != nil {
			t.Fatal(err)
		}
		done := readAsync(c, buf)
		if i%2 == 0 {
			time.Sleep(time.Millisecond) // sometimes blocked, sometimes not yet
		}
		// net/http's instant deadline, the proxy's own (now), and now on the wall clock.
		end := [...]time.Time{aLongTimeAgo, time.Now(), time.Now().Round(0)}[i%3]
		if err := c.SetReadDeadline(end); err != nil {
			t.Fatal(err)
		}
		select {
		case r := <-done:
			if !errors.Is(r.err, os.ErrDeadlineExceeded) {
				t.Fatalf("round %d: Read = %d, %v; want os.ErrDeadlineExceeded", i, r.n, r.err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("round %d: a deadline at %v did not end the Read", i, end)
		}
		if err := c.SetReadDeadline(time.Time{}); err != nil {
			t.Fatal(err)
		}
		if _, err := client.Write([]byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
		if n, err := c.Read(buf); err != nil || n != 1 || buf[0] != byte(i) {
			t.Fatalf("round %d: Read with no deadline = %d, %v; want the byte written", i, n, err)
		}
	}
}

// TestLazyDeadlinesConcurrentSets: deadlines set from several goroutines at once, while
// a Read keeps returning at them, leave the connection as the last one set says: no
// deadline reads what comes, a deadline in the future ends a Read not before it.
func TestLazyDeadlinesConcurrentSets(t *testing.T) {
	t.Parallel()
	c, client := lazyPair(t, time.Millisecond)
	var stop atomic.Bool
	reading := make(chan struct{})
	go func() {
		defer close(reading)
		buf := make([]byte, 1)
		for !stop.Load() {
			_, _ = c.Read(buf) // nothing comes: each returns at a deadline
		}
	}()
	for round := range 300 {
		var wg sync.WaitGroup
		for g := range 3 {
			wg.Go(func() {
				for i := range 20 {
					// Deadlines past, near, far and none, in every order.
					var d time.Time
					switch k := (g*7 + i*13 + round) % 6; k {
					case 0:
					case 1:
						d = aLongTimeAgo
					default:
						d = time.Now().Add(time.Duration(k*k) * time.Millisecond)
					}
					if err := c.SetReadDeadline(d); err != nil {
						t.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
	}
	stop.Store(true)
	if err := c.SetReadDeadline(aLongTimeAgo); err != nil { // ends the last Read
		t.Fatal(err)
	}
	select {
	case <-reading:
	case <-time.After(10 * time.Second):
		t.Fatal("a deadline in the past did not end the last Read")
	}

	if err := c.SetReadDeadline(time.Time{}); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1)
	done := readAsync(c, buf)
	time.Sleep(50 * time.Millisecond)
	if _, err := client.Write([]byte{7}); err != nil {
		t.Fatal(err)
	}
	if r := wait(t, done); r.err != nil || r.n != 1 || buf[0] != 7 {
		t.Fatalf("Read with no deadline = %d, %v; want the byte written", r.n, r.err)
	}
	deadline := time.Now().Add(150 * time.Millisecond)
	if err := c.SetReadDeadline(deadline); err != nil {
		t.Fatal(err)
	}
	r := wait(t, readAsync(c, buf))
	if !errors.Is(r.err, os.ErrDeadlineExceeded) || r.at.Before(deadline) {
		t.Errorf("Read = %v %v after the deadline; want os.ErrDeadlineExceeded, not before it", r.err, r.at.Sub(deadline))
	}
}

// TestLazyDeadlinesSweeperEnds: the sweeper runs while the listener has connections, and
// ends once they are closed.
func TestLazyDeadlinesSweeperEnds(t *testing.T) {
	t.Parallel()
	c, _ := lazyPair(t, time.Millisecond)
	s := c.ln.conns
	s.mu.Lock()
	sweeping := s.sweeping
	s.mu.Unlock()
	if !sweeping {
		t.Fatal("no sweeper while the listener has a connection")
	}
	c.Close()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		s.mu.Lock()
		sweeping, n := s.sweeping, len(s.m)
		s.mu.Unlock()
		if !sweeping && n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("10 s after its last connection closed: sweeping %v, %d connections kept", sweeping, n)
		}
	}
}

// TestLazyDeadlinesConn: the accepted connection still shuts down its writing side
// (net/http's graceful close) and writes from a reader, as a *net.TCPConn does, and
// refuses deadlines once closed; ConnContext finds the socket under it.
func TestLazyDeadlinesConn(t *testing.T) {
	t.Parallel()
	c, client := lazyPair(t, 0)
	if n, err := c.ReadFrom(io.LimitReader(zeroReader{}, 1000)); n != 1000 || err != nil {
		t.Fatalf("ReadFrom = %d, %v; want 1000, nil", n, err)
	}
	if err := c.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(client)
	if err != nil || len(got) != 1000 {
		t.Errorf("client read %d bytes, %v; want 1000 then EOF", len(got), err)
	}
	p := &Proxy{}
	ctx := p.ConnContext(t.Context(), c)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	for _, d := range []time.Time{{}, time.Now().Add(time.Hour), aLongTimeAgo} {
		if err := c.SetReadDeadline(d); !errors.Is(err, net.ErrClosed) {
			t.Errorf("SetReadDeadline(%v) after Close = %v, want net.ErrClosed", d, err)
		}
	}
	if cc := ctx.Value(clientConnKey{}); cc == nil {
		t.Error("ConnContext found no socket under a connection from LazyDeadlines")
	} else if !cc.(*clientConn).plain {
		t.Error("ConnContext took a connection from LazyDeadlines for TLS")
	}
}

// zeroReader reads zeros for ever.
type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// BenchmarkReadDeadlines: the read deadlines net/http sets for one request on a
// kept-alive connection with ReadHeaderTimeout and IdleTimeout (the idle wait, a read
// of the request's first byte, the header deadline, none for the handler and its
// background read, an instant one that ends the background read, none again), on the
// socket itself and through LazyDeadlines; and on the socket without the timeouts
// (every deadline none but the instant one), as net/http sets them by default.
func BenchmarkReadDeadlines(b *testing.B) {
	for _, bc := range []struct {
		name   string
		lazy   bool
		idle   time.Duration
		header time.Duration
	}{
		{"socket", false, 120 * time.Second, 10 * time.Second},
		{"lazy", true, 120 * time.Second, 10 * time.Second},
		{"socket-no-timeouts", false, 0, 0},
	} {
		b.Run(bc.name, func(b *testing.B) {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			defer l.Close()
			if bc.lazy {
				l = LazyDeadlines(l, 0, 0)
			}
			client, err := net.Dial("tcp", l.Addr().String())
			if err != nil {
				b.Fatal(err)
			}
			defer client.Close()
			c, err := l.Accept()
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			deadline := func(d time.Duration) time.Time {
				if d == 0 {
					return time.Time{}
				}
				return time.Now().Add(d)
			}
			buf, chunk := make([]byte, 1), make([]byte, 64<<10)
			left := 0 // bytes written and not read yet
			b.ReportAllocs()
			for b.Loop() {
				_ = c.SetReadDeadline(deadline(bc.idle))
				if left == 0 {
					if _, err := client.Write(chunk); err != nil {
						b.Fatal(err)
					}
					left = len(chunk)
				}
				if _, err := c.Read(buf); err != nil {
					b.Fatal(err)
				}
				left--
				_ = c.SetReadDeadline(deadline(bc.header))
				_ = c.SetReadDeadline(time.Time{})
				_ = c.SetReadDeadline(time.Time{})
				_ = c.SetReadDeadline(aLongTimeAgo)
				_ = c.SetReadDeadline(time.Time{})
			}
		})
	}
}

// TestLazyDeadlinesWallClockStep: a deadline without a monotonic reading (time.Unix,
// t.UTC(), t.Round(0)) counts, as a *net.TCPConn's does, from when it is set on the
// wall clock, so that a step of the wall clock since the process started moves none:
// a deadline in the past ends a blocked Read at once, one in the future ends it not
// before it. The step is simulated by moving deadlineBase's wall reading (not its
// monotonic one), as a step of the wall clock after it was read would, in a process of
// its own: the sweepers of the other tests read deadlineBase.
func TestLazyDeadlinesWallClockStep(t *testing.T) {
	if os.Getenv("LAZY_WALL_CLOCK_STEP") == "" {
		t.Parallel()
		cmd := exec.Command(os.Args[0], "-test.run=^TestLazyDeadlinesWallClockStep$", "-test.count=1", "-test.v")
		cmd.Env = append(os.Environ(), "LAZY_WALL_CLOCK_STEP=1")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		return
	}
	saved := deadlineBase
	defer func() { deadlineBase = saved }()
	for _, step := range []time.Duration{time.Hour, -time.Hour} {
		base := saved
		// time.Time's wall field, with a monotonic reading: seconds in bits 30 to 62.
		wall := (*uint64)(unsafe.Pointer(&base))
		*wall = uint64(int64(*wall) - int64(step/time.Second)<<30)
		if got := base.Round(0).Sub(saved.Round(0)); got != -step {
			t.Fatalf("forged base's wall = %v from the real one, want %v", got, -step)
		}
		deadlineBase = base
		func() {
			c, client := lazyPair(t, 10*time.Millisecond)
			defer func() { // the sweeper ends before deadlineBase is put back
				c.Close()
				client.Close()
				for c.ln.conns.mu.Lock(); c.ln.conns.sweeping; c.ln.conns.mu.Lock() {
					c.ln.conns.mu.Unlock()
					time.Sleep(time.Millisecond)
				}
				c.ln.conns.mu.Unlock()
			}()

			// A wall-clock deadline at now ends a blocked Read at once.
			done := readAsync(c, make([]byte, 1))
			time.Sleep(10 * time.Millisecond)
			if err := c.SetReadDeadline(time.Now().UTC()); err != nil {
				t.Fatal(err)
			}
			select {
			case r := <-done:
				if !errors.Is(r.err, os.ErrDeadlineExceeded) {
					t.Fatalf("wall clock stepped %v: Read = %v, want os.ErrDeadlineExceeded", step, r.err)
				}
			case <-time.After(2 * time.Second):
				t.Fatalf("wall clock stepped %v: a wall-clock deadline at now did not end the Read in 2 s", step)
			}

			// A wall-clock deadline 30 minutes away does not end a Read in 300 ms.
			if err := c.SetReadDeadline(time.Now().UTC().Add(30 * time.Minute)); err != nil {
				t.Fatal(err)
			}
			done = readAsync(c, make([]byte, 1))
			select {
			case r := <-done:
				t.Fatalf("wall clock stepped %v: Read = %v with a deadline 30 min away", step, r.err)
			case <-time.After(300 * time.Millisecond):
			}
			_ = c.SetReadDeadline(aLongTimeAgo)
			wait(t, done)
		}()
	}
}

// TestLazyDeadlinesNowSweeperHeldUp: a deadline at now reaches the socket at once even
// while the sweeper is held up (here by goroutines that keep every P busy, as a loaded
// proxy does), as net.Conn's does: taken for one in the future because it is later than
// the sweeper's last look, it ended a blocked Read only at the sweeper's next look, tens
// of resolutions late.
func TestLazyDeadlinesNowSweeperHeldUp(t *testing.T) {
	c, _ := lazyPair(t, 2*time.Millisecond)
	var stop atomic.Bool
	var busy sync.WaitGroup
	defer busy.Wait()
	defer stop.Store(true)
	for range 4 {
		busy.Go(func() {
			for x := 0; !stop.Load(); x++ {
			}
		})
	}
	missed := 0
	for range 50 {
		if err := c.SetReadDeadline(time.Now().Add(time.Hour)); err != nil {
			t.Fatal(err)
		}
		done := readAsync(c, make([]byte, 1))
		time.Sleep(time.Millisecond)
		if err := c.SetReadDeadline(time.Now()); err != nil {
			t.Fatal(err)
		}
		if !c.past.Load() {
			missed++
		}
		if r := wait(t, done); !errors.Is(r.err, os.ErrDeadlineExceeded) {
			t.Fatalf("Read = %d, %v; want os.ErrDeadlineExceeded", r.n, r.err)
		}
	}
	if missed > 0 {
		t.Errorf("%d of 50 deadlines at now did not reach the socket at once", missed)
	}
}
