package main

// Core's answer to an upload given before the upload is whole (a bad apikey, a full
// scan queue, a file it refuses), run black-box against the built binary: the client
// must get that answer, status and body, every time, as curl sends an upload.

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mdproxy/mdproxy/internal/testkit/sidecartest"
)

// earlyRefusal is an upstream that refuses an upload after reading read bytes of it
// (0: none), with Core's JSON error and Connection: close, as Core does for a bad
// apikey, a full scan queue or a file over its size limit.
func earlyRefusal(read int64) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if read > 0 {
			_, _ = io.CopyN(io.Discard, r.Body, read)
		}
		w.Header().Set("Connection", "close")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		_, _ = io.WriteString(w, `{"err":"x"}`)
	}
}

// abruptRefusal is a raw upstream that reads a request's headers and read bytes of its
// body, answers 400 {"err":"x"} with Connection: close and closes the socket at once,
// its receive buffer unread: the peer's writes then fail with a reset, as with a Core
// that closes without lingering. It serves until cleanup.
func abruptRefusal(t *testing.T, read int64) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(safety))
				br := bufio.NewReader(c)
				for {
					line, err := br.ReadString('\n')
					if err != nil {
						return
					}
					if line == "\r\n" {
						break
					}
				}
				if read > 0 {
					_, _ = io.CopyN(io.Discard, br, read)
				}
				_, _ = io.WriteString(c, "HTTP/1.1 400 Bad Request\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{\"err\":\"x\"}")
			})
		}
	})
	return "http://" + ln.Addr().String()
}

// rawUpload sends a POST /file of size bytes as curl does (see rawUploadWith) and
// returns the status and body of the final answer (0 and "" when it was lost).
func rawUpload(t *testing.T, addr string, size int64, expect bool) (int, string) {
	t.Helper()
	return rawUploadWith(t, addr, size, expect, "")
}

// rawUploadWith sends a POST /file of size bytes on a raw connection, with more header
// lines (each ending in "\r\n"), as curl sends an upload, and returns the status and
// body of the final answer (0 and "" when it was lost). With expect, it asks for 100
// Continue and waits for it a second at most, as curl does for a body over 1 MiB, and
// sends no body when the final answer comes first. The body goes in writes of 64 KiB
// while the answer is read, and stops once the final answer is in, then the connection
// is closed. A write that fails before the final answer was read loses the answer: curl
// ends there ("Send failure: Connection reset by peer", exit 55), without reading what
// came; so does a connection cut before the answer.
func rawUploadWith(t *testing.T, addr string, size int64, expect bool, headers string) (int, string) {
	t.Helper()
	c := dial(t, addr)
	defer c.Close()
	head := fmt.Sprintf("POST /file HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n", size) + headers
	if expect {
		head += "Expect: 100-continue\r\n"
	}
	if _, err := io.WriteString(c, head+"\r\n"); err != nil {
		t.Fatal(err)
	}
	var (
		code      int
		body      string
		answered  = make(chan struct{})    // the final answer was read, or reading ended
		continued = make(chan struct{}, 1) // 100 Continue came
	)
	go func() {
		defer close(answered)
		br := bufio.NewReader(c)
		for {
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				return
			}
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			switch {
			case resp.StatusCode == http.StatusContinue:
				select {
				case continued <- struct{}{}:
				default:
				}
				continue
			case resp.StatusCode < 200:
				continue
			case err == nil:
				code, body = resp.StatusCode, string(b)
			}
			return
		}
	}()
	if expect {
		select {
		case <-continued:
		case <-answered:
		case <-time.After(time.Second):
		}
	}
	buf := make([]byte, 64<<10)
	for sent := int64(0); sent < size; {
		select {
		case <-answered:
			sent = size // the answer came: send no more
			continue
		default:
		}
		n, err := c.Write(buf[:min(int64(len(buf)), size-sent)])
		sent += int64(n)
		if err != nil {
			select {
			case <-answered:
			default:
				return 0, "" // curl gives up here
			}
		}
	}
	<-answered // the connection's deadline (dial) bounds the wait
	return code, body
}

// zeros is an endless reader of zero bytes.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }

// TestEarlyRefusalRelayed is case 3: Core answering an upload before reading all of
// it must reach the client as Core's status and body every time, not as a 502.
func TestEarlyRefusalRelayed(t *testing.T) {
	tests := []struct {
		name   string
		read   int64
		expect bool
		abrupt bool // the upstream closes without lingering
	}{
		{"after 2 MiB, Expect: 100-continue", 2 << 20, true, false},
		{"after 2 MiB", 2 << 20, false, false},
		{"at once, Expect: 100-continue", 0, true, false},
		{"at once", 0, false, false},
		{"after 2 MiB, closing abruptly", 2 << 20, false, true},
		{"after 2 MiB, closing abruptly, Expect: 100-continue", 2 << 20, true, true},
		{"at once, closing abruptly", 0, false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var upstream string
			if tt.abrupt {
				upstream = abruptRefusal(t, tt.read)
			} else {
				upstream = newLoopback(t, earlyRefusal(tt.read)).URL
			}
			p := startBinary(t, upstream, nil)
			const runs = 8
			for i := range runs {
				code, body := rawUpload(t, p.proxyAddr, 50<<20, tt.expect)
				if code != http.StatusBadRequest || body != `{"err":"x"}` {
					t.Errorf("upload #%d refused by Core = %d %q, want Core's 400 {\"err\":\"x\"}", i, code, body)
				}
			}
			waitMetricAtLeast(t, p, series("mdproxy_requests_total", "code", "400", "method", "POST", "route", "submit"), runs)
			m := p.metrics(t)
			for _, kind := range []string{"refused", "reset", "timeout", "canceled", "other"} {
				if v, _ := sidecartest.ParseMetrics(t, m).Value(series("mdproxy_upstream_errors_total", "kind", kind, "route", "submit")); v != 0 {
					t.Errorf("mdproxy_upstream_errors_total{kind=%q,route=\"submit\"} = %v, want 0", kind, v)
				}
			}
			if v, _ := sidecartest.ParseMetrics(t, m).Value(series("mdproxy_requests_total", "code", "502", "method", "POST", "route", "submit")); v != 0 {
				t.Errorf("answers 502 to refused uploads = %v, want 0", v)
			}
		})
	}
}

// TestEarlyAnswerNotReset is issue 29's trial: Core reads 2 MiB of a 10 MiB upload and
// answers 400 with Connection: close. Each upload, sent as curl sends it (with Expect:
// 100-continue, as curl does above 1 MiB, and without), gets Core's answer through
// mdproxy, the bridge on (the default) and off: the client's connection is not closed
// while the client still sends the body it has not learnt is refused (a close with its
// data unread resets the connection, and curl gives up at its next write, the answer
// unread), but read on until the client stops.
func TestEarlyAnswerNotReset(t *testing.T) {
	const runs = 30
	core := newLoopback(t, earlyRefusal(2<<20))
	for _, bridge := range []bool{true, false} {
		p := startBinary(t, core.URL, map[string]string{"MDPROXY_BRIDGE": strconv.FormatBool(bridge)})
		for _, expect := range []bool{true, false} {
			lost := 0
			for range runs {
				if code, body := rawUpload(t, p.proxyAddr, 10<<20, expect); code != http.StatusBadRequest || body != `{"err":"x"}` {
					lost++
				}
			}
			if lost > 0 {
				t.Errorf("bridge %v, Expect: 100-continue %v: %d of %d uploads of 10 MiB lost Core's 400 {\"err\":\"x\"} given after 2 MiB", bridge, expect, lost, runs)
			}
		}
	}
}

// TestEarlyAnswerBounded: after an answer given while a client still sends its upload,
// the proxy reads on for a bounded number of bytes, for a bounded time: a client that
// sends for ever, reading nothing, has its connection closed once the proxy has read
// 16 MiB more (long before the body idle timeout of 60 s, past the test's wait), and
// one that goes silent once the body idle timeout (1 s here) has passed. Each has
// Core's answer waiting on its connection.
func TestEarlyAnswerBounded(t *testing.T) {
	core := newLoopback(t, earlyRefusal(2<<20))
	patient := startBinary(t, core.URL, map[string]string{"MDPROXY_BODY_IDLE_TIMEOUT": "60s", "MDPROXY_BRIDGE": "false"})
	brief := startBinary(t, core.URL, map[string]string{"MDPROXY_BODY_IDLE_TIMEOUT": "1s", "MDPROXY_BRIDGE": "false"})
	// upload sends p a body of 1 TiB, after its 100 Continue with expect, first writing
	// send bytes of it (all: -1), and returns the connection's reader and the error
	// that ended the sending.
	upload := func(t *testing.T, p *proc, expect bool, send int64) (*bufio.Reader, error) {
		c := dial(t, p.proxyAddr)
		br := bufio.NewReader(c)
		head := "POST /file HTTP/1.1\r\nHost: x\r\nContent-Length: 1099511627776\r\n"
		if expect {
			head += "Expect: 100-continue\r\n"
		}
		if _, err := io.WriteString(c, head+"\r\n"); err != nil {
			t.Fatal(err)
		}
		if expect {
			if resp, err := http.ReadResponse(br, nil); err != nil || resp.StatusCode != http.StatusContinue {
				t.Fatalf("upload asking for 100 Continue: %v, %v; want 100 Continue", resp, err)
			}
		}
		var err error
		if send < 0 {
			_, err = io.Copy(c, zeros{})
		} else {
			_, err = io.CopyN(c, zeros{}, send)
		}
		return br, err
	}
	// answer reads the final answer waiting in br, after any 1xx (Core's 100 Continue
	// relayed may come beside net/http's own): Core's 400.
	answer := func(t *testing.T, br *bufio.Reader) {
		resp, err := http.ReadResponse(br, nil)
		for err == nil && resp.StatusCode < 200 {
			resp, err = http.ReadResponse(br, nil)
		}
		if err != nil {
			t.Fatalf("reading the answer: %v", err)
		}
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusBadRequest || string(b) != `{"err":"x"}` {
			t.Errorf("answer = %d %q, want Core's 400 {\"err\":\"x\"}", resp.StatusCode, b)
		}
	}
	for _, expect := range []bool{true, false} {
		t.Run(fmt.Sprintf("sends for ever, Expect %v", expect), func(t *testing.T) {
			br, err := upload(t, patient, expect, -1)
			if err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("sending for ever: %v; want the connection closed by the proxy", err)
			}
			answer(t, br)
		})
		t.Run(fmt.Sprintf("goes silent, Expect %v", expect), func(t *testing.T) {
			br, err := upload(t, brief, expect, 4<<20)
			if err != nil {
				t.Fatalf("sending 4 MiB: %v", err)
			}
			answer(t, br)
			if rest, err := io.ReadAll(br); err != nil || len(rest) > 0 {
				t.Errorf("after the answer: %q, %v; want the connection closed", rest, err)
			}
		})
	}
}

// goneAfter is a raw upstream that reads a request's headers and read bytes of its
// body, then closes the connection without an answer. It serves until cleanup.
func goneAfter(t *testing.T, read int64) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(safety))
				_, _ = io.CopyN(io.Discard, c, read)
			})
		}
	})
	return "http://" + ln.Addr().String()
}

// TestOwnAnswerNotReset: the proxy's own answers to an upload the client is still
// sending reach it as curl sends uploads, every time: the 502 when Core goes away
// after 2 MiB without answering, and the limit answer to an upload over the submit
// route's limit (its body never read).
func TestOwnAnswerNotReset(t *testing.T) {
	const runs = 10
	t.Run("Core gone", func(t *testing.T) {
		p := startBinary(t, goneAfter(t, 2<<20), nil)
		for _, expect := range []bool{true, false} {
			for i := range runs {
				if code, body := rawUpload(t, p.proxyAddr, 10<<20, expect); code != http.StatusBadGateway || !strings.Contains(body, `"err":"Core could not be reached`) {
					t.Errorf("Expect %v, #%d: upload Core dropped after 2 MiB = %d %q, want 502 in Core's error format", expect, i, code, body)
				}
			}
		}
	})
	t.Run("limit answer", func(t *testing.T) {
		core := newLoopback(t, func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			_, _ = io.WriteString(w, `{"data_id":"x"}`)
		})
		p := startBinary(t, core.URL, map[string]string{"MDPROXY_SUBMIT_RATE": "0.00001", "MDPROXY_SUBMIT_BURST": "1"})
		if code, body := rawUpload(t, p.proxyAddr, 1<<20, false); code != http.StatusOK {
			t.Fatalf("first upload = %d %q, want 200 (the bucket's one token)", code, body)
		}
		for _, expect := range []bool{true, false} {
			for i := range runs {
				if code, body := rawUpload(t, p.proxyAddr, 10<<20, expect); code != http.StatusServiceUnavailable || !strings.Contains(body, `"err":"Too many requests`) {
					t.Errorf("Expect %v, #%d: upload over the limit = %d %q, want the limit answer", expect, i, code, body)
				}
			}
		}
	})
}
