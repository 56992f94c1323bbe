// Package sidecartest holds what the tests of mdproxy share, in-process (package
// sidecar, through Run) and black-box (cmd/mdproxy, through the built binary): a
// stand-in for Core that records what it receives, a log buffer that tells when a line
// was written, uploads of deterministic payloads checked byte for byte, the one reader
// of metrics (Metrics, of a registry or a /metrics page), a checker of JSON logs, a
// made-up PKI and a dialer's small receive buffer (ReceiveBuffer). It is for tests only.
package sidecartest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Safety bounds a wait that only a broken program would reach; a test never passes or
// fails because of how long it took.
const Safety = 30 * time.Second

// LogBuffer collects log output. It is safe for concurrent use, and tells when a line
// containing some text was written (slog writes each record in one Write). The zero
// value is an empty buffer.
type LogBuffer struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	waits []logWait
}

type logWait struct {
	text string
	left int // lines containing text still to come
	ch   chan struct{}
}

// Write appends p; it never fails.
func (b *LogBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf.Write(p)
	kept := b.waits[:0]
	for _, w := range b.waits {
		if bytes.Contains(p, []byte(w.text)) {
			w.left--
		}
		if w.left <= 0 {
			close(w.ch)
		} else {
			kept = append(kept, w)
		}
	}
	b.waits = kept
	return len(p), nil
}

// Written returns a channel closed once a line containing text has been written.
func (b *LogBuffer) Written(text string) <-chan struct{} { return b.WrittenN(text, 1) }

// WrittenN returns a channel closed once n lines containing text have been written, in
// all (those written before the call count).
func (b *LogBuffer) WrittenN(text string, n int) <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	ch := make(chan struct{})
	for line := range bytes.Lines(b.buf.Bytes()) {
		if bytes.Contains(line, []byte(text)) {
			n--
		}
	}
	if n <= 0 {
		close(ch)
	} else {
		b.waits = append(b.waits, logWait{text: text, left: n, ch: ch})
	}
	return ch
}

// String returns everything written so far.
func (b *LogBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Upload is what the upstream received of one POST /file, as it answers it in JSON.
type Upload struct {
	N      int64  `json:"bytes"`
	SHA256 string `json:"sha256"`
	Err    string `json:"err,omitempty"`
}

// Upstream stands for Core: it records every request it sees, answers /readyz and
// other paths with a body naming them ("upstream /path\n"), and hashes the body of
// POST /file, answering its Upload as JSON (400 when reading the body failed). It is
// safe for concurrent use.
type Upstream struct {
	*httptest.Server
	// Received counts the upload bytes read so far, over all uploads.
	Received atomic.Int64
	// FirstByte is closed when the first upload byte arrives.
	FirstByte chan struct{}
	// Uploads receives each upload's Upload once its body was read; it holds 8.
	Uploads chan Upload

	mu        sync.Mutex
	seen      []string // "METHOD /path?query"
	firstOnce sync.Once
}

// NewUpstream starts an Upstream on loopback; cleanup closes it.
func NewUpstream(t testing.TB) *Upstream {
	t.Helper()
	u := &Upstream{FirstByte: make(chan struct{}), Uploads: make(chan Upload, 8)}
	u.Server = httptest.NewServer(http.HandlerFunc(u.serve))
	t.Cleanup(u.Close)
	return u
}

func (u *Upstream) serve(w http.ResponseWriter, r *http.Request) {
	u.mu.Lock()
	u.seen = append(u.seen, r.Method+" "+r.URL.RequestURI())
	u.mu.Unlock()
	switch {
	case r.Method == http.MethodPost && r.URL.Path == "/file":
		h := sha256.New()
		n, err := io.Copy(h, &signalReader{r: r.Body, u: u})
		up := Upload{N: n, SHA256: hex.EncodeToString(h.Sum(nil))}
		if err != nil {
			up.Err = err.Error()
		}
		u.Uploads <- up
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(up)
	case r.URL.Path == "/readyz":
		_, _ = io.WriteString(w, "upstream readyz\n")
	default:
		_, _ = io.WriteString(w, "upstream "+r.URL.Path+"\n")
	}
}

// Requests returns the requests seen so far, in order, each as "METHOD /path?query".
func (u *Upstream) Requests() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return slices.Clone(u.seen)
}

// Saw reports whether the upstream saw req ("METHOD /path?query").
func (u *Upstream) Saw(req string) bool {
	return slices.Contains(u.Requests(), req)
}

// signalReader counts the upload's bytes at the upstream and signals the first.
type signalReader struct {
	r io.Reader
	u *Upstream
}

func (s *signalReader) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	if n > 0 {
		s.u.Received.Add(int64(n))
		s.u.firstOnce.Do(func() { close(s.u.FirstByte) })
	}
	return n, err
}

// NewClient returns a client of its own, whose connections are closed by cleanup, and
// which never goes through an HTTP proxy of the environment.
func NewClient(t testing.TB) *http.Client {
	tr := &http.Transport{DisableCompression: true}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

// Get returns the status and body of GET url; it fails t when the request fails.
func Get(t testing.TB, c *http.Client, url string) (int, string) {
	t.Helper()
	resp, err := c.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: reading body: %v", url, err)
	}
	return resp.StatusCode, string(b)
}

// Short returns s cut to 200 bytes, for messages.
func Short(s string) string {
	if len(s) > 200 {
		return s[:200] + "..."
	}
	return s
}

// CheckJSONLogs checks that logs is a non-empty run of JSON lines, each an object with
// time, level and msg, and returns them.
func CheckJSONLogs(t testing.TB, logs string) []map[string]any {
	t.Helper()
	if logs == "" {
		t.Fatal("mdproxy logged nothing, want JSON lines")
	}
	if !strings.HasSuffix(logs, "\n") {
		t.Errorf("logs end with %q, want a newline", logs[max(0, len(logs)-40):])
	}
	var lines []map[string]any
	for i, line := range strings.Split(strings.TrimSuffix(logs, "\n"), "\n") {
		if !json.Valid([]byte(line)) {
			t.Errorf("log line %d = %q, want valid JSON", i+1, line)
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Errorf("log line %d = %q, want a JSON object: %v", i+1, line, err)
			continue
		}
		for _, key := range []string{"time", "level", "msg"} {
			if _, ok := m[key]; !ok {
				t.Errorf("log line %d = %q, want a %q key", i+1, line, key)
			}
		}
		lines = append(lines, m)
	}
	return lines
}

// NamesVar reports whether msg names the variable name as a whole word: not as a part
// of a longer name (MDPROXY_UPSTREAM_TIMEOUT is not named by
// MDPROXY_UPSTREAM_TIMEOUTS, nor MDPROXY_STAT_RATE by MDPROXY_XSTAT_RATE).
func NamesVar(msg, name string) bool {
	isNameByte := func(b byte) bool {
		return b == '_' || 'A' <= b && b <= 'Z' || 'a' <= b && b <= 'z' || '0' <= b && b <= '9'
	}
	for i := 0; ; {
		j := strings.Index(msg[i:], name)
		if j < 0 {
			return false
		}
		start, end := i+j, i+j+len(name)
		if (start == 0 || !isNameByte(msg[start-1])) && (end == len(msg) || !isNameByte(msg[end])) {
			return true
		}
		i = start + 1
	}
}

// Payload returns size deterministic pseudo-random bytes of seed, a stream (a 300 MiB
// upload is never held in memory), and their SHA-256 in hex.
func Payload(seed byte, size int64) (io.Reader, string) {
	newStream := func() io.Reader {
		return io.LimitReader(rand.NewChaCha8([32]byte{seed}), size)
	}
	h := sha256.New()
	if _, err := io.Copy(h, newStream()); err != nil {
		panic(err)
	}
	return newStream(), hex.EncodeToString(h.Sum(nil))
}

// UploadResult is the outcome of PostFile.
type UploadResult struct {
	Status int    // the answer's status; 0 when the request failed
	Body   Upload // the upstream's answer, forwarded by the proxy, on 200
	Raw    string // the answer's body
	Err    error  // the request's, reading the answer's or decoding its JSON
}

// PostFile uploads size bytes from body to url + /file with a Content-Length, as Core's
// clients do.
func PostFile(ctx context.Context, c *http.Client, url string, body io.Reader, size int64) UploadResult {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/file", body)
	if err != nil {
		return UploadResult{Err: err}
	}
	req.ContentLength = size
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := c.Do(req)
	if err != nil {
		return UploadResult{Err: err}
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	res := UploadResult{Status: resp.StatusCode, Raw: string(raw), Err: err}
	if err == nil && resp.StatusCode == http.StatusOK {
		res.Err = json.Unmarshal(raw, &res.Body)
	}
	return res
}

// CheckUpload checks that an upload of size bytes hashing to sum succeeded byte for
// byte: the client got 200 with the upstream's count and hash, and the upstream
// received exactly that.
func CheckUpload(t testing.TB, up *Upstream, res UploadResult, size int64, sum string) {
	t.Helper()
	if res.Err != nil || res.Status != http.StatusOK {
		t.Fatalf("POST /file of %d bytes = %d %q, %v; want 200", size, res.Status, res.Raw, res.Err)
	}
	want := Upload{N: size, SHA256: sum}
	if res.Body != want {
		t.Errorf("POST /file answer = %+v, want %+v", res.Body, want)
	}
	select {
	case got := <-up.Uploads:
		if got != want {
			t.Errorf("upstream received %+v, want %+v", got, want)
		}
	case <-time.After(Safety):
		t.Errorf("upstream recorded no upload")
	}
}
