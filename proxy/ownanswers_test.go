package proxy

import (
	"errors"
	"io"
	"net"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mdproxy/mdproxy/internal/testkit/sidecartest"
	"github.com/mdproxy/mdproxy/limiter"
	"github.com/mdproxy/mdproxy/metrics"
)

// TestOwnAnswersToStalledReaderCut: a client that sends polls back to back and reads
// none of the limit answers has its connection closed: each answer sets a write
// deadline. The bucket lets the first poll through (forwarded, its answer Core's with a
// deadline of its own) and no other for 1000 s.
func TestOwnAnswersToStalledReaderCut(t *testing.T) {
	const idle = 300 * time.Millisecond
	p, err := New(Options{Upstream: closedAddr(t), Metrics: metrics.New(prometheus.NewRegistry()), BodyIdleTimeout: idle,
		Limits: limitSet(t, map[string]limiter.Limit{"file_result": {Rate: 0.001, Burst: 1}}, nil)})
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewServer(p)
	t.Cleanup(front.Close)
	d := net.Dialer{Control: sidecartest.ReceiveBuffer(4096)}
	c, err := d.Dial("tcp", front.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var sent atomic.Int64
	wrote := make(chan struct{})
	go func() {
		defer close(wrote)
		batch := []byte(strings.Repeat("GET /file/0123456789abcdef HTTP/1.1\r\nHost: x\r\n\r\n", 100))
		for sent.Load() < 100000 {
			if _, err := c.Write(batch); err != nil {
				return
			}
			sent.Add(100)
		}
	}()
	// Wait until the proxy has taken no request for ten times the body idle
	// timeout: the client's kernel may take data for a while after the proxy
	// stops taking requests (it makes room by compacting its queue).
	for last, quiet := sent.Load(), 0; quiet < 30; {
		time.Sleep(idle / 3)
		if n := sent.Load(); n != last {
			last, quiet = n, 0
		} else {
			quiet++
		}
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	answers, err := readAnswers(c)
	c.Close()
	<-wrote
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() || answers >= int(sent.Load()) {
		t.Errorf("answers unread for %v: the connection still open, %d of %d requests answered (%v); want it closed",
			10*idle, answers, sent.Load(), err)
	}
}

// readAnswers reads c to its end and returns how many HTTP/1.1 answers came, and the
// error that ended them (nil for the connection's end).
func readAnswers(c net.Conn) (int, error) {
	data, err := io.ReadAll(c)
	return strings.Count(string(data), "HTTP/1.1 "), err
}
