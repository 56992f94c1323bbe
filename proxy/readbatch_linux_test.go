package proxy

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mdproxy/mdproxy/metrics"
)

// batchProxy is a proxy with Options.UploadReadBatch of batch bytes and a body idle
// timeout of idle, served as the sidecar serves it (ConnContext), in front of an
// upstream that answers each upload with the SHA-256 of the bytes it read. conns
// receives each client connection the proxy's server accepts.
type batchProxy struct {
	url   string
	conns chan *net.TCPConn
}

func newBatchProxy(t *testing.T, batch int, idle time.Duration) *batchProxy {
	t.Helper()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := sha256.New()
		n, err := io.Copy(h, r.Body)
		if err != nil {
			http.Error(w, `{"err":"body cut"}`, http.StatusBadRequest)
			return
		}
		fmt.Fprintf(w, `{"data_id":"%s","bytes":%d}`, hex.EncodeToString(h.Sum(nil)), n)
	}))
	t.Cleanup(up.Close)
	u, err := url.Parse(up.URL)
	if err != nil {
		t.Fatal(err)
	}
	tr := upstreamTransport(t, TransportOptions{})
	p, err := New(Options{Upstream: u, Metrics: metrics.New(prometheus.NewRegistry()), Transport: tr,
		UploadReadBatch: batch, BodyIdleTimeout: idle})
	if err != nil {
		t.Fatal(err)
	}
	bp := &batchProxy{conns: make(chan *net.TCPConn, 16)}
	front := httptest.NewUnstartedServer(p)
	front.Listener = LazyDeadlines(front.Listener, testResolution, 0) // as the sidecar serves it
	front.Config.ConnContext = func(ctx context.Context, c net.Conn) context.Context {
		if lc, ok := c.(*lazyConn); ok {
			c = lc.tcp()
		}
		if tc, ok := c.(*net.TCPConn); ok {
			select {
			case bp.conns <- tc:
			default:
			}
		}
		return p.ConnContext(ctx, c)
	}
	front.Start()
	t.Cleanup(front.Close)
	bp.url = front.URL
	return bp
}

// rcvLowat returns the receive low-water mark of c's socket, in bytes.
func rcvLowat(c *net.TCPConn) (int, error) {
	return sockopt(c, syscall.SOL_SOCKET, syscall.SO_RCVLOWAT)
}

// upload posts body (length bytes) to the proxy with client and returns the status and
// the answer.
func (bp *batchProxy) upload(t *testing.T, client *http.Client, body io.Reader, length int64) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), longWait)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, bp.url+"/file", body)
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = length
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("upload of %d bytes: %v", length, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading the answer to an upload of %d bytes: %v", length, err)
	}
	return resp.StatusCode, string(b)
}

// wantWhole is the upstream's answer to a body of n bytes of bodyStream.
func wantWhole(t *testing.T, n int64) string {
	t.Helper()
	sum, _, err := sha256Hex(bodyStream(n))
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf(`{"data_id":"%s","bytes":%d}`, sum, n)
}

// TestUploadReadBatchWhole: with the receive low-water mark on, uploads of every size
// around the batching threshold reach Core byte for byte; the mark is in force while a
// large upload streams and back at one byte after each, and the same client connection
// then serves its next request.
func TestUploadReadBatchWhole(t *testing.T) {
	noLeak(t)
	const batch = 512 << 10
	bp := newBatchProxy(t, batch, 0)
	client := keepAliveClient(t, 1)

	sizes := []int64{1, batch + readBatchMargin - 1, batch + readBatchMargin, 1<<20 + 1, 32<<20 + 12345}
	var conn *net.TCPConn
	for _, n := range sizes {
		var peak atomic.Int64
		stop := make(chan struct{})
		watched := make(chan struct{})
		if conn != nil {
			go func() { // the mark the proxy sets on its side of the connection
				defer close(watched)
				for {
					if m, err := rcvLowat(conn); err == nil {
						peak.Store(max(peak.Load(), int64(m)))
					}
					select {
					case <-stop:
						return
					case <-time.After(50 * time.Microsecond):
					}
				}
			}()
		} else {
			close(watched)
		}
		code, answer := bp.upload(t, client, bodyStream(n), n)
		close(stop)
		<-watched
		if code != http.StatusOK || answer != wantWhole(t, n) {
			t.Errorf("upload of %d bytes: %d %s; want 200 %s", n, code, answer, wantWhole(t, n))
		}
		if conn == nil {
			conn = <-bp.conns
		}
		if got, err := rcvLowat(conn); err != nil || got > 1 {
			t.Errorf("after an upload of %d bytes, the connection's SO_RCVLOWAT = %d (%v), want at most 1 (one byte, as the kernel's default)", n, got, err)
		}
		if n >= 32<<20 && peak.Load() < readBatchMin {
			t.Errorf("while %d bytes streamed, the highest SO_RCVLOWAT seen = %d, want at least %d", n, peak.Load(), readBatchMin)
		}
		if n > 0 && n < batch+readBatchMargin && peak.Load() > 1 {
			t.Errorf("upload of %d bytes, under the %d-byte batch and its margin: SO_RCVLOWAT %d seen, want none", n, batch, peak.Load())
		}
	}
	select {
	case c := <-bp.conns:
		t.Errorf("the proxy accepted a second connection (%v): the client's first was not kept alive after an upload", c.RemoteAddr())
	default:
	}
	resp, body := do(t, client, http.MethodGet, bp.url+"/file/0123456789abcdef0123456789abcdef", nil)
	if resp.StatusCode != http.StatusOK {
		t.Errorf("GET after the uploads on the same connection: %d %s, want 200", resp.StatusCode, body)
	}
}

// trickle is a request body read from r: head bytes at once, then pieces pieces of
// piece bytes, each after a gap, then the rest at once.
type trickle struct {
	r           io.Reader
	head, piece int64
	pieces      int
	gap         time.Duration
	sent        int64
}

func (b *trickle) Read(p []byte) (int, error) {
	switch {
	case b.sent < b.head:
		p = p[:min(int64(len(p)), b.head-b.sent)]
	case b.pieces > 0:
		b.pieces--
		time.Sleep(b.gap)
		p = p[:min(int64(len(p)), b.piece)]
	}
	n, err := b.r.Read(p)
	b.sent += int64(n)
	return n, err
}

// TestUploadReadBatchSlowClient: a client whose upload slows from full speed to a
// trickle of small pieces, each well within the body idle timeout but the whole trickle
// longer than it, gets its upload through whole: a read waiting for a batch that does
// not come takes what came (readBatchWait), so that progress is seen as it happens.
func TestUploadReadBatchSlowClient(t *testing.T) {
	noLeak(t)
	const idle = 400 * time.Millisecond
	bp := newBatchProxy(t, 512<<10, idle)
	const n = 4 << 20
	body := &trickle{r: bodyStream(n), head: 2 << 20, piece: 1 << 10, pieces: 12, gap: idle / 4}
	code, answer := bp.upload(t, keepAliveClient(t, 1), body, n)
	if code != http.StatusOK || answer != wantWhole(t, n) {
		t.Errorf("upload that trickled for %v in pieces every %v (body idle timeout %v): %d %s; want 200 %s",
			12*body.gap, body.gap, idle, code, answer, wantWhole(t, n))
	}
}

// TestUploadReadBatchStalled: a client that goes silent in the middle of a batched
// upload is still cut after the body idle timeout with 408, in Core's error format.
func TestUploadReadBatchStalled(t *testing.T) {
	noLeak(t)
	const idle = 300 * time.Millisecond
	bp := newBatchProxy(t, 512<<10, idle)
	const n = 4 << 20
	pr, pw := io.Pipe()
	silent := make(chan struct{})
	go func() {
		_, _ = io.CopyN(pw, bodyStream(n), 2<<20+1000)
		<-silent
		pw.Close()
	}()
	code, answer := bp.upload(t, keepAliveClient(t, 1), pr, n)
	close(silent)
	if code != http.StatusRequestTimeout || !strings.Contains(answer, `"err"`) {
		t.Errorf("upload stalled after 2 MiB (body idle timeout %v): %d %s; want 408 in Core's error format", idle, code, answer)
	}
}

// TestNewRefusesSmallReadBatch: an UploadReadBatch between 0 and readBatchMin is
// refused by New, naming the value.
func TestNewRefusesSmallReadBatch(t *testing.T) {
	u, _ := url.Parse("http://127.0.0.1:1")
	_, err := New(Options{Upstream: u, Metrics: metrics.New(prometheus.NewRegistry()), UploadReadBatch: 1000})
	if err == nil || !strings.Contains(err.Error(), "1000") {
		t.Errorf("New with UploadReadBatch 1000 = %v, want an error naming 1000", err)
	}
}

// TestReadBatchMarkBounded: on a real socket, a mark never outlasts the read it was set
// for asking for more than the bytes still to come (net/http may read the rest of a
// body itself), and a mark left between reads drops to one byte after readBatchWait,
// whoever reads next.
func TestReadBatchMarkBounded(t *testing.T) {
	noLeak(t)
	_, sc := loopbackPair(t)
	rc, err := sc.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	mark := func() int {
		m, err := rcvLowat(sc)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	const length, batch = 2 << 20, 512 << 10

	rb := newReadBatch(rc, length, batch)
	rb.before(0, 1<<20)
	if got := mark(); got != batch {
		t.Fatalf("mark for the first read of %d bytes = %d, want %d", length, got, batch)
	}
	rb.after(length-100<<10, length-100<<10) // 100 KiB left: less than the mark
	if got := mark(); got > 1 {
		t.Errorf("after a read that left 100 KiB of the body, mark = %d, want at most 1", got)
	}
	rb.end()

	rb = newReadBatch(rc, length, batch)
	defer rb.end()
	rb.before(0, 1<<20)
	rb.after(600<<10, 600<<10) // 1.4 MiB left: the mark may stay for the next read
	if got := mark(); got != batch {
		t.Fatalf("after a read that left 1.4 MiB, mark = %d, want %d kept", got, batch)
	}
	deadline := time.Now().Add(longWait)
	for mark() > 1 {
		if time.Now().After(deadline) {
			t.Fatalf("a mark of %d left between reads still set after %v, want it dropped after %v", batch, longWait, readBatchWait)
		}
		time.Sleep(time.Millisecond)
	}
}
