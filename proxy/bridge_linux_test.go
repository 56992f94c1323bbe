package proxy

import (
	"bytes"
	"errors"
	"io"
	"net"
	"net/http"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mdproxy/mdproxy/bridge"
	"github.com/mdproxy/mdproxy/metrics"
)

// TestLongStoredAnswerToSlowReader: a stored result longer than the socket buffers
// hold, polled by a client that reads it slowly but steadily, arrives whole, whether
// the kernel bounds the connection (ConnContext) or the write deadline does: that
// deadline counts from each piece written (ownPiece), not from the answer's first byte,
// and the kernel's bound from the client's last taking data. Here the whole answer
// takes at least 1.6 times the body idle timeout to read (32 reads 50 ms apart), while
// the client never pauses for more than a twentieth of it, a margin that holds on a
// loaded machine.
func TestLongStoredAnswerToSlowReader(t *testing.T) {
	for _, connContext := range []bool{true, false} {
		name := "write deadline"
		if connContext {
			name = "kernel"
		}
		t.Run(name, func(t *testing.T) { slowReadStoredAnswer(t, connContext) })
	}
}

func slowReadStoredAnswer(t *testing.T, connContext bool) {
	const id = "61dffeaa728844adbf49eb090e4ece0e"
	body := bytes.Repeat([]byte("0123456789abcdef"), 1<<19) // 8 MiB
	br, store := newTestBridgeStoreOf(t, 256<<20)           // keeps results of up to 16 MiB
	store.Put(id, bridge.Result{Body: body, ContentType: "application/json", Owner: bridge.OwnerOf("k")})
	p, err := New(Options{Upstream: closedAddr(t), Metrics: metrics.New(prometheus.NewRegistry()),
		Bridge: br, BodyIdleTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	base := serveProxy(t, p, p, connContext, false, nil).URL
	// A small receive buffer, so that the answer waits in the proxy's send buffer
	// (at most 4 MiB) and its writes, for the client's reads.
	dialer := &net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
		return errors.Join(err, serr)
	}}
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DialContext: dialer.DialContext}}
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
	for {
		n, err := io.CopyN(&got, resp.Body, 256<<10)
		if err != nil || n == 0 {
			break
		}
		time.Sleep(50 * time.Millisecond) // at most 5 MiB a second: 1.6 s or more for the answer
	}
	if !bytes.Equal(got.Bytes(), body) {
		t.Fatalf("read %d of %d bytes in %v; want the whole stored result for a client that keeps reading",
			got.Len(), len(body), time.Since(start).Round(time.Millisecond))
	}
}
