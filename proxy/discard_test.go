package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mdproxy/mdproxy/limiter"
)

// silentAfter sends head (request line and headers, each ending in "\r\n") and body on a
// new connection to proxyURL's host, then goes silent with the connection open, and
// returns the answer's status and body. A client that never gets one fails t after
// hang, far beyond the body idle timeout of the proxies these tests build.
func silentAfter(t *testing.T, proxyURL, head string, body []byte) (int, string) {
	t.Helper()
	const hang = 10 * time.Second
	u, err := url.Parse(proxyURL)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.DialTimeout("tcp", u.Host, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := fmt.Fprintf(conn, "%sHost: %s\r\n\r\n%s", head, u.Host, body); err != nil {
		t.Fatalf("writing the request: %v", err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(hang))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no answer to a client silent in its body (%q): %v; want one after the body idle timeout", head, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestSilentClientAnswered: a client that goes silent in the middle of its request body
// gets its answer once the body idle timeout has passed, whoever answers: net/http reads
// up to 256 KiB of an unread body before it writes an answer, and that read is bounded
// too. Before, a client silent with less than 256 KiB left waited for ever, holding its
// connection.
func TestSilentClientAnswered(t *testing.T) {
	noLeak(t)
	const idle = 300 * time.Millisecond
	upstream := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Early") != "" { // Core refuses the upload after 64 KiB of it
			_, _ = io.CopyN(io.Discard, r.Body, 64<<10)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusRequestEntityTooLarge)
			_, _ = io.WriteString(w, `{"err":"too large"}`)
			return
		}
		if _, err := io.Copy(io.Discard, r.Body); err != nil {
			return // the proxy cut the upload: it answers the client itself
		}
		_, _ = io.WriteString(w, `{"data_id":"0123456789abcdef0123456789abcdef"}`)
	})
	limits := limitSet(t, map[string]limiter.Limit{"batch_open": {Rate: 0.001, Burst: 1}}, newFakeClock())
	proxyURL, _ := newTestProxy(t, upstream, func(o *Options) {
		o.BodyIdleTimeout = idle
		o.Limits = limits
	})
	t.Run("forwarded upload, 100 KiB left", func(t *testing.T) {
		code, body := silentAfter(t, proxyURL,
			"POST /file HTTP/1.1\r\nContent-Type: application/octet-stream\r\nContent-Length: 1048576\r\n",
			make([]byte, 1<<20-100<<10))
		if code != http.StatusRequestTimeout || !strings.Contains(body, `"err"`) {
			t.Errorf("answer = %d %s, want 408 in Core's error format", code, body)
		}
	})
	t.Run("Core answers early, 100 KiB left", func(t *testing.T) {
		code, body := silentAfter(t, proxyURL,
			"POST /file HTTP/1.1\r\nX-Early: 1\r\nContent-Type: application/octet-stream\r\nContent-Length: 1048576\r\n",
			make([]byte, 1<<20-100<<10))
		if code != http.StatusRequestEntityTooLarge || body != `{"err":"too large"}` {
			t.Errorf("answer = %d %s, want Core's 413 relayed", code, body)
		}
	})
	t.Run("chunked upload refused", func(t *testing.T) {
		code, body := silentAfter(t, proxyURL, "POST /file HTTP/1.1\r\nTransfer-Encoding: chunked\r\n",
			[]byte("400\r\n"+strings.Repeat("a", 0x400)+"\r\n"))
		if code != http.StatusLengthRequired || !strings.Contains(body, `"err"`) {
			t.Errorf("answer = %d %s, want 411 in Core's error format", code, body)
		}
	})
	t.Run("limit answer", func(t *testing.T) {
		resp, body := do(t, nil, http.MethodPost, proxyURL+"/file/batch", nil) // takes the one token
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("first POST /file/batch = %d %s, want 200 from the upstream", resp.StatusCode, body)
		}
		code, answer := silentAfter(t, proxyURL,
			"POST /file/batch HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: 2048\r\n",
			[]byte(`{"`))
		if code != http.StatusServiceUnavailable || !strings.Contains(answer, `"err"`) {
			t.Errorf("POST /file/batch over the limit = %d %s, want 503 in Core's error format", code, answer)
		}
	})
}

// TestEarlyAnswerDrained: Core's answer to an upload it has not read whole reaches a
// client that goes on sending the body until it reads the answer, its writes never
// failing first (a client connection closed with its data unread is reset, and curl
// gives up at its next write, the answer unread), whether Core closes its connection
// or reads on after answering, the client asked for 100 Continue or not.
func TestEarlyAnswerDrained(t *testing.T) {
	noLeak(t)
	const size = 4 << 20
	upstream := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.CopyN(io.Discard, r.Body, 64<<10)
		readsOn := r.Header.Get("X-Reads-On") != ""
		if readsOn {
			_ = http.NewResponseController(w).EnableFullDuplex()
		} else {
			w.Header().Set("Connection", "close")
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusRequestEntityTooLarge)
		_, _ = io.WriteString(w, `{"err":"too large"}`)
		if readsOn {
			_ = http.NewResponseController(w).Flush()
			_, _ = io.Copy(io.Discard, r.Body)
		}
	})
	proxyURL, _ := newTestProxy(t, upstream, nil)
	u, err := url.Parse(proxyURL)
	if err != nil {
		t.Fatal(err)
	}
	for _, readsOn := range []bool{false, true} {
		for _, expect := range []bool{false, true} {
			t.Run(fmt.Sprintf("Core reads on %v, Expect %v", readsOn, expect), func(t *testing.T) {
				head := fmt.Sprintf("POST /file HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n", size)
				if readsOn {
					head += "X-Reads-On: 1\r\n"
				}
				if expect {
					head += "Expect: 100-continue\r\n"
				}
				for i := range 5 {
					if code, body, err := sendUntilAnswered(u.Host, head, size); err != nil || code != http.StatusRequestEntityTooLarge || body != `{"err":"too large"}` {
						t.Errorf("#%d: %d %q, %v; want Core's 413 {\"err\":\"too large\"}", i, code, body, err)
					}
				}
			})
		}
	}
}

// sendUntilAnswered sends head (ending in "\r\n"), a blank line, then a body of size
// zero bytes on a new connection to addr, reading answers meanwhile, and stops sending
// once the final answer is in (after 100 Continue, when head asks for it). It returns
// that answer's status and body, or the error of a write that failed before it.
func sendUntilAnswered(addr, head string, size int64) (int, string, error) {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return 0, "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, head+"\r\n"); err != nil {
		return 0, "", err
	}
	var (
		code      int
		body      string
		answered  = make(chan struct{})
		continued = make(chan struct{})
		once      sync.Once
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
			if resp.StatusCode == http.StatusContinue {
				once.Do(func() { close(continued) })
				continue
			}
			if err == nil {
				code, body = resp.StatusCode, string(b)
			}
			return
		}
	}()
	if strings.Contains(head, "Expect:") {
		select {
		case <-continued:
		case <-answered:
			return code, body, nil
		}
	}
	buf := make([]byte, 64<<10)
	for sent := int64(0); sent < size; {
		select {
		case <-answered:
			return code, body, nil
		default:
		}
		n, err := c.Write(buf[:min(int64(len(buf)), size-sent)])
		sent += int64(n)
		if err != nil {
			select {
			case <-answered:
				return code, body, nil
			default:
				return 0, "", fmt.Errorf("writing the body before the answer: %w", err)
			}
		}
	}
	<-answered
	return code, body, nil
}
