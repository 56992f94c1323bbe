package proxy

import (
	"bytes"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mdproxy/mdproxy/bridge"
	"github.com/mdproxy/mdproxy/internal/testkit/sidecartest"
	"github.com/mdproxy/mdproxy/metrics"
)

// TestLongStoredAnswerToSlowReader: a stored result longer than the socket buffers
// hold, polled by a client that reads it slowly but steadily, arrives whole: the write
// deadline counts from each piece written (ownPiece), not from the answer's first byte. The whole answer takes at
// least 1.2 times the body idle timeout to read (48 reads 50 ms apart). A client that
// paused for half the timeout or more (a machine too loaded to run it) proves nothing
// either way: that try does not count, and the test tries again.
func TestLongStoredAnswerToSlowReader(t *testing.T) {
	const tries = 5
	for range tries {
		if slowReadStoredAnswer(t) {
			return
		}
	}
	t.Skipf("the client paused for half the body idle timeout or more in each of %d tries: the machine is too loaded for this test", tries)
}

// slowReadStoredAnswer polls a stored result of 12 MiB and reads it 256 KiB at a time,
// 50 ms apart, under a body idle timeout of 2 s. It fails t if the answer is cut while
// the client never paused for 1 s or more, and returns whether the try counted.
func slowReadStoredAnswer(t *testing.T) bool {
	const (
		id      = "61dffeaa728844adbf49eb090e4ece0e"
		timeout = 2 * time.Second
	)
	body := bytes.Repeat([]byte("0123456789abcdef"), 3<<18) // 12 MiB
	br, store := newTestBridgeStoreOf(t, 256<<20)           // keeps results of up to 16 MiB
	store.Put(id, bridge.Result{Body: body, ContentType: "application/json", Owner: bridge.OwnerOf("k")})
	p, err := New(Options{Upstream: closedAddr(t), Metrics: metrics.New(prometheus.NewRegistry()),
		Bridge: br, BodyIdleTimeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewServer(p)
	t.Cleanup(front.Close)
	base := front.URL
	// A small receive buffer, so that the answer waits in the proxy's send buffer
	// (at most 4 MiB) and its writes, for the client's reads.
	dialer := &net.Dialer{Control: sidecartest.ReceiveBuffer(4096)}
	tr := &http.Transport{DialContext: dialer.DialContext}
	defer tr.CloseIdleConnections()
	client := &http.Client{Timeout: time.Minute, Transport: tr}
	req, _ := http.NewRequest(http.MethodGet, base+"/file/"+id, nil)
	req.Header.Set("Apikey", "k")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status = %d, want 200 (a store hit)", resp.StatusCode)
	}
	var got bytes.Buffer
	start := time.Now()
	last, longest := start, time.Duration(0)
	for {
		n, err := io.CopyN(&got, resp.Body, 256<<10)
		now := time.Now()
		longest, last = max(longest, now.Sub(last)), now
		if err != nil || n == 0 {
			break
		}
		time.Sleep(50 * time.Millisecond) // at most 5 MiB a second: 2.4 s or more for the answer
	}
	if bytes.Equal(got.Bytes(), body) {
		return true
	}
	if longest >= timeout/2 {
		t.Logf("read %d of %d bytes in %v, the client pausing up to %v: the try does not count",
			got.Len(), len(body), time.Since(start).Round(time.Millisecond), longest.Round(time.Millisecond))
		return false
	}
	t.Fatalf("read %d of %d bytes in %v, the client never pausing %v or more; want the whole stored result for a client that keeps reading",
		got.Len(), len(body), time.Since(start).Round(time.Millisecond), timeout/2)
	return false
}
