package sidecar

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mdproxy/mdproxy/internal/testkit/sidecartest"
)

// TestRunClientTimeouts: MDPROXY_READ_HEADER_TIMEOUT and MDPROXY_IDLE_TIMEOUT hold on
// the proxy's listener (net/http's own server timeouts): a client that sends part of its headers, or sends them a
// byte at a time, is cut once the header timeout has passed, and not before; a
// kept-alive connection outlives the header timeout and serves a request that comes
// within the idle timeout, and is closed once the idle timeout has passed after its
// last answer, not before. The idle timeout leaves the second request 1.4 s to come
// after the client's pause: a loaded machine may stretch the pause, never shorten it.
func TestRunClientTimeouts(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: about 3 s")
	}
	t.Parallel()
	const header, idle = 300 * time.Millisecond, 2 * time.Second
	up := sidecartest.NewUpstream(t)
	in := startRun(t, up.URL, map[string]string{
		"MDPROXY_READ_HEADER_TIMEOUT": header.String(),
		"MDPROXY_IDLE_TIMEOUT":        idle.String(),
	})
	dial := func(t *testing.T) net.Conn {
		t.Helper()
		c, err := net.Dial("tcp", in.proxyAddr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second)) // the test's own bound
		return c
	}
	// closed reads c until the proxy closes it and returns when, or an error if the
	// proxy answered other than 400 (net/http's answer to headers cut in a field) or
	// the test's bound passed. Safe in any goroutine.
	closed := func(c net.Conn) (time.Time, error) {
		got, err := io.ReadAll(c)
		at := time.Now()
		switch {
		case len(got) > 0 && !strings.HasPrefix(string(got), "HTTP/1.1 400 "):
			return at, fmt.Errorf("the proxy answered %q, want the connection closed, at most after a 400", got)
		case err != nil && !errors.Is(err, syscall.ECONNRESET):
			return at, fmt.Errorf("reading until the proxy closes the connection: %w", err)
		}
		return at, nil
	}
	// notBefore fails t if the connection closed at at, or err, less than want after start.
	notBefore := func(t *testing.T, at time.Time, err error, start time.Time, want time.Duration) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		if after := at.Sub(start); after < want {
			t.Errorf("connection closed %v after the client dialled, want no sooner than the header timeout %v", after, want)
		}
	}

	// The header timeout counts from when the proxy starts reading the request, at
	// the connection's accept: start is taken before the dial, so that a loaded
	// machine's delay between the accept and the client's first bytes (22 ms seen)
	// is not counted against the proxy.
	t.Run("partial headers", func(t *testing.T) {
		t.Parallel()
		start := time.Now()
		c := dial(t)
		if _, err := io.WriteString(c, "GET /file/x HTTP/1.1\r\nHost: a\r\n"); err != nil {
			t.Fatal(err)
		}
		at, err := closed(c)
		notBefore(t, at, err, start, header)
	})

	t.Run("headers a byte at a time", func(t *testing.T) {
		t.Parallel()
		start := time.Now()
		c := dial(t)
		type end struct {
			at  time.Time
			err error
		}
		done := make(chan end, 1)
		go func() {
			at, err := closed(c)
			done <- end{at, err}
		}()
		// 200 bytes of a header field that never ends, one every 20 ms (4 s).
		req := "GET /file/x HTTP/1.1\r\nHost: a\r\nX-Slow: " + strings.Repeat("s", 200)
		for i := range len(req) {
			if _, err := c.Write([]byte{req[i]}); err != nil {
				break // closed: done tells when
			}
			select {
			case e := <-done:
				notBefore(t, e.at, e.err, start, header)
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
		select {
		case e := <-done:
			notBefore(t, e.at, e.err, start, header)
		case <-time.After(10 * time.Second):
			t.Error("a client sending its headers a byte every 20 ms for 4 s was not cut")
		}
	})

	t.Run("kept alive", func(t *testing.T) {
		t.Parallel()
		c := dial(t)
		br := bufio.NewReader(c)
		get := func() {
			t.Helper()
			if _, err := io.WriteString(c, "GET /file/x HTTP/1.1\r\nHost: a\r\n\r\n"); err != nil {
				t.Fatal(err)
			}
			res, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, res.Body)
			res.Body.Close()
			if res.StatusCode != http.StatusOK {
				t.Fatalf("GET /file/x = %d, want 200 from the upstream", res.StatusCode)
			}
		}
		get()
		time.Sleep(2 * header) // past the header timeout, within the idle timeout
		get()
		last := time.Now()
		if _, err := br.ReadByte(); err != io.EOF && !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("read after the idle timeout = %v, want the connection closed", err)
		}
		if after := time.Since(last); after < idle {
			t.Errorf("idle connection closed %v after its last answer, want no sooner than the idle timeout %v", after, idle)
		}
	})
}
