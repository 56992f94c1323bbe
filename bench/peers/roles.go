package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/mdproxy/mdproxy/sidecar"
)

// The processes this program starts of itself: the coordinator runs its own executable
// again with roleEnv set (main, or TestMain under go test), so that the stand-in, the
// bare servers and the upload client are processes of their own, pinned to a core.
const (
	roleEnv     = "MDPEERS_ROLE"     // standin, bare503, bare503t, bareresult, bareproxy, relay, relay-splice or upload
	addrEnv     = "MDPEERS_ADDR"     // the address a server role listens on
	upstreamEnv = "MDPEERS_UPSTREAM" // the upstream of bareproxy and the relays, host:port
	urlEnv      = "MDPEERS_URL"      // upload: where to POST
	sizeEnv     = "MDPEERS_SIZE"     // upload: bytes of each upload
	countEnv    = "MDPEERS_COUNT"    // upload: how many at once, each on its own connection
)

// statsPath is the stand-in's own counters; no route of Core's API starts with it.
const statsPath = "/_peers/stats"

// runRole runs the role named by roleEnv and returns the process's exit code.
func runRole(role string) int {
	var err error
	switch role {
	case "standin":
		err = serve(os.Getenv(addrEnv), newStandin())
	case "bare503":
		err = serve(os.Getenv(addrEnv), bare503{})
	case "bare503t":
		err = serveTimed(os.Getenv(addrEnv), bare503{})
	case "bareresult":
		err = serveTimed(os.Getenv(addrEnv), newBareResult(result(benchID)))
	case "bareproxy":
		err = serve(os.Getenv(addrEnv), newBareProxy(os.Getenv(upstreamEnv)))
	case "relay", "relay-splice":
		err = relay(os.Getenv(addrEnv), os.Getenv(upstreamEnv), role == "relay-splice")
	case "upload":
		err = uploadRole()
	default:
		err = fmt.Errorf("unknown role %q", role)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "peers %s: %v\n", role, err)
		return 1
	}
	return 0
}

// serve serves h on addr with net/http's defaults, as a plain Go server has them,
// until SIGTERM or SIGINT.
func serve(addr string, h http.Handler) error {
	return serveWith(addr, &http.Server{Handler: h})
}

// serveWith runs srv on addr until SIGTERM or SIGINT.
func serveWith(addr string, srv *http.Server) error {
	return serveUntilSignal(addr, srv.Serve, srv.Close)
}

// serveUntilSignal listens on addr and runs serve on the listener until serve returns
// (its error) or SIGTERM or SIGINT arrives: then it returns shut's error (nil without
// shut), the listener closed. A role's process exits next, ending what serve started.
func serveUntilSignal(addr string, serve func(net.Listener) error, shut func() error) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	defer ln.Close()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	errc := make(chan error, 1)
	go func() { errc <- serve(ln) }()
	select {
	case <-ctx.Done():
		if shut == nil {
			return nil
		}
		return shut()
	case err := <-errc:
		return err
	}
}

// limitBody is mdproxy's limit answer for file_result (proxy.errorBody), byte for byte;
// every limit answer of the benchmark carries it.
const limitBody = `{"err":"Too many requests for route file_result. Try again later."}`

// Header values of the limit answer, shared as mdproxy shares its own.
var (
	jsonType    = []string{"application/json; charset=utf-8"}
	nosniff     = []string{"nosniff"}
	retryAfter1 = []string{"1"}
	limitLen    = []string{strconv.Itoa(len(limitBody))}
	limitBytes  = []byte(limitBody)
)

// bare503 answers every request with mdproxy's limit answer: the least a net/http
// server can do for a request, the ceiling of a limit answer in Go.
type bare503 struct{}

func (bare503) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	h := w.Header()
	h["Retry-After"] = retryAfter1
	h["Content-Type"] = jsonType
	h["Content-Length"] = limitLen
	h["X-Content-Type-Options"] = nosniff
	w.WriteHeader(http.StatusServiceUnavailable)
	_, _ = w.Write(limitBytes)
}

// timedServer is a server of h with the client timeouts mdproxy's server has by default
// (MDPROXY_READ_HEADER_TIMEOUT and MDPROXY_IDLE_TIMEOUT, read from its configuration's
// defaults), which net/http enforces with read deadlines set on the connection several
// times a request, two of them in the future (a runtime timer each). Of bare503, it is the ceiling of a limit answer for a Go server
// that bounds slow and idle clients; of a bareResult, that of a store hit.
func timedServer(h http.Handler) (*http.Server, error) {
	cfg, err := sidecar.LoadConfig(map[string]string{"MDPROXY_UPSTREAM_URL": "http://127.0.0.1:1"})
	if err != nil {
		return nil, err
	}
	return &http.Server{Handler: h, ReadHeaderTimeout: cfg.ReadHeaderTimeout, IdleTimeout: cfg.IdleTimeout}, nil
}

// serveTimed serves h on addr with mdproxy's client timeouts (timedServer) until
// SIGTERM or SIGINT.
func serveTimed(addr string, h http.Handler) error {
	srv, err := timedServer(h)
	if err != nil {
		return err
	}
	return serveWith(addr, srv)
}

// bareResult answers every request 200 with one of the stand-in's final results, as
// many bytes as a store hit answers (1.7 KB; bare503 answers 67): what net/http itself
// spends on a store hit's answer, with nothing of mdproxy's.
type bareResult struct {
	body   []byte
	length []string // Content-Length
}

func newBareResult(body []byte) bareResult {
	return bareResult{body: body, length: []string{strconv.Itoa(len(body))}}
}

func (b bareResult) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	h := w.Header()
	h["Content-Type"] = jsonType
	h["Content-Length"] = b.length
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(b.body)
}

// newBareProxy is a plain httputil.ReverseProxy to upstream (host:port): Rewrite with
// SetURL and SetXForwarded, as mdproxy's, and a transport that keeps up to 256 idle
// connections to it, as mdproxy's does (net/http's default of 2 would open a new
// connection for most of 64 concurrent polls).
func newBareProxy(upstream string) http.Handler {
	u := &url.URL{Scheme: "http", Host: upstream}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConns, tr.MaxIdleConnsPerHost = 256, 256
	tr.DisableCompression = true
	tr.ForceAttemptHTTP2 = false
	return &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(u)
			r.SetXForwarded()
		},
		Transport: tr,
	}
}

// The stand-in's scan result: a final result of a clean Office file as Core 5 answers
// it, about 1.7 KB, with the data_id in two places.
const idMark = "@@DATA_ID@@"

var resultParts = func() [][]byte {
	engine := func(id string, scan int) map[string]any {
		return map[string]any{"def_time": "2024-05-02T06:00:00.000Z", "eng_id": id, "location": "local",
			"scan_result_i": 0, "scan_time": scan, "threat_found": "", "wait_time": 2}
	}
	res := map[string]any{
		"data_id": idMark,
		"file_info": map[string]any{
			"display_name": "quarterly-report.docx", "file_size": 48213,
			"file_type":             "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
			"file_type_description": "Microsoft Word Open XML Document",
			"md5":                   "9e107d9d372bb6826bd81d3542a419d6",
			"sha1":                  "2fd4e1c67a2d28fced849ee1bb76e7391b93eb12",
			"sha256":                "d7a8fbb307d7809469ca9abcb0082e4f8d5651e46d3cdb762d02d0bf37c9e592",
			"upload_timestamp":      "2024-05-02T10:12:44.120Z",
		},
		"process_info": map[string]any{
			"blocked_reason": "", "file_type_skipped_scan": false, "processing_time": 1834,
			"profile": "File process", "progress_percentage": 100, "queue_time": 12,
			"result": "Allowed", "user_agent": "", "username": "", "verdicts": []string{"No Threat Detected"},
			"post_processing": map[string]any{"actions_failed": "", "actions_ran": "", "converted_destination": "",
				"converted_to": "", "copy_move_destination": ""},
		},
		"scan_results": map[string]any{
			"data_id": idMark, "progress_percentage": 100, "scan_all_result_a": "No Threat Detected",
			"scan_all_result_i": 0, "start_time": "2024-05-02T10:12:44.132Z", "total_avs": 4, "total_time": 1834,
			"scan_details": map[string]any{
				"ClamAV": engine("clamav_1_linux", 152), "ESET": engine("eset_1_linux", 388),
				"K7": engine("k7_1_linux", 97), "Avira": engine("avira_1_linux", 241),
			},
		},
		"vulnerability_info": map[string]any{},
	}
	b, err := json.Marshal(res)
	if err != nil {
		panic(err)
	}
	return bytes.Split(b, []byte(idMark))
}()

// result is the stand-in's final result for id.
func result(id string) []byte {
	b := make([]byte, 0, resultLen(id))
	return appendResult(b, id)
}

func resultLen(id string) int {
	n := 0
	for _, p := range resultParts {
		n += len(p)
	}
	return n + (len(resultParts)-1)*len(id)
}

func appendResult(b []byte, id string) []byte {
	for i, p := range resultParts {
		if i > 0 {
			b = append(b, id...)
		}
		b = append(b, p...)
	}
	return b
}

// standinStats are the stand-in's counters, served at statsPath.
type standinStats struct {
	Gets              int64 `json:"gets"`               // GET /file/{id} answered
	Posts             int64 `json:"posts"`              // POST /file received
	UploadBytes       int64 `json:"upload_bytes"`       // body bytes read from POST /file
	UploadsComplete   int64 `json:"uploads_complete"`   // POST /file whose body was read whole, as long as its Content-Length
	UploadsIncomplete int64 `json:"uploads_incomplete"` // the others (answered 400)
	CallbacksOK       int64 `json:"callbacks_ok"`       // results posted to a callbackurl and answered 200
	CallbacksFailed   int64 `json:"callbacks_failed"`   // the others
}

// standin is the upstream every proxy forwards to: Core's two routes the benchmark
// uses, and the callback Core makes when a submission names a callbackurl.
type standin struct {
	gets, posts, upBytes, upOK, upBad, cbOK, cbBad atomic.Int64
	bufs                                           sync.Pool
	cb                                             *http.Client
}

func newStandin() *standin {
	return &standin{
		bufs: sync.Pool{New: func() any { b := make([]byte, 256<<10); return &b }},
		cb:   &http.Client{Timeout: 10 * time.Second},
	}
}

func (s *standin) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, "/file/"):
		id := r.URL.Path[len("/file/"):]
		bp := s.bufs.Get().(*[]byte)
		b := appendResult((*bp)[:0], id)
		h := w.Header()
		h["Content-Type"] = jsonType
		h["Content-Length"] = []string{strconv.Itoa(len(b))}
		_, _ = w.Write(b)
		s.bufs.Put(bp)
		s.gets.Add(1)
	case r.Method == http.MethodPost && r.URL.Path == "/file":
		s.upload(w, r)
	case r.Method == http.MethodGet && r.URL.Path == statsPath:
		st := standinStats{Gets: s.gets.Load(), Posts: s.posts.Load(), UploadBytes: s.upBytes.Load(),
			UploadsComplete: s.upOK.Load(), UploadsIncomplete: s.upBad.Load(),
			CallbacksOK: s.cbOK.Load(), CallbacksFailed: s.cbBad.Load()}
		w.Header()["Content-Type"] = jsonType
		_ = json.NewEncoder(w).Encode(st)
	default:
		http.Error(w, `{"err":"Not found"}`, http.StatusNotFound)
	}
}

// upload reads and discards a submission, counting its bytes, and answers a new
// data_id; with a callbackurl header it then posts the final result of that id there,
// as Core does when the scan is over.
func (s *standin) upload(w http.ResponseWriter, r *http.Request) {
	s.posts.Add(1)
	bp := s.bufs.Get().(*[]byte)
	var n int64
	var err error
	for {
		var k int
		k, err = r.Body.Read(*bp)
		n += int64(k)
		if err != nil {
			break
		}
	}
	s.bufs.Put(bp)
	s.upBytes.Add(n)
	if err != io.EOF || n != r.ContentLength {
		s.upBad.Add(1)
		http.Error(w, fmt.Sprintf(`{"err":"body of %d bytes, want %d: %v"}`, n, r.ContentLength, err), http.StatusBadRequest)
		return
	}
	s.upOK.Add(1)
	id := newID()
	w.Header()["Content-Type"] = jsonType
	_, _ = io.WriteString(w, `{"data_id":"`+id+`"}`)
	if cb := r.Header.Get("callbackurl"); cb != "" {
		go s.callback(cb, id)
	}
}

// callback posts id's result to cb, up to three times while it cannot be delivered.
func (s *standin) callback(cb, id string) {
	for try := 0; try < 3; try++ {
		if try > 0 {
			time.Sleep(100 * time.Millisecond)
		}
		resp, err := s.cb.Post(cb, "application/json", bytes.NewReader(result(id)))
		if err != nil {
			continue
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			s.cbOK.Add(1)
			return
		}
		break // an answer other than 200 is the bridge's verdict; trying again changes nothing
	}
	s.cbBad.Add(1)
}

// newID is a data_id as Core makes them: 32 hex digits.
func newID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// zeros reads as left zero bytes.
type zeros struct{ left int64 }

func (z *zeros) Read(p []byte) (int, error) {
	if z.left <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > z.left {
		p = p[:z.left]
	}
	clear(p)
	z.left -= int64(len(p))
	return len(p), nil
}

// uploadResult is what an upload client reports: how long all its uploads took, from
// the first byte sent to the last answer read, and each one's answer.
type uploadResult struct {
	Seconds  float64  `json:"seconds"`
	Bytes    int64    `json:"bytes"` // bytes of each upload
	Statuses []int    `json:"statuses"`
	Errors   []string `json:"errors,omitempty"`
}

// uploadRole runs countEnv uploads of sizeEnv zeros at once to urlEnv and prints the
// uploadResult as JSON on stdout.
func uploadRole() error {
	size, err := strconv.ParseInt(os.Getenv(sizeEnv), 10, 64)
	if err != nil {
		return fmt.Errorf("%s: %w", sizeEnv, err)
	}
	n, err := strconv.Atoi(os.Getenv(countEnv))
	if err != nil || n < 1 {
		return fmt.Errorf("%s: want a count >= 1", countEnv)
	}
	res := uploads(context.Background(), os.Getenv(urlEnv), size, n)
	return json.NewEncoder(os.Stdout).Encode(res)
}

// uploads posts n uploads of size zeros at once to target, each on a connection of
// its own.
func uploads(ctx context.Context, target string, size int64, n int) uploadResult {
	res := uploadResult{Bytes: size, Statuses: make([]int, n)}
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		wg.Go(func() { res.Statuses[i], errs[i] = upload(ctx, target, size) })
	}
	wg.Wait()
	res.Seconds = time.Since(start).Seconds()
	for _, err := range errs {
		if err != nil {
			res.Errors = append(res.Errors, err.Error())
		}
	}
	return res
}

// upload posts size zeros to target with Content-Length, on a new connection, and
// returns the answer's status once its body is read.
func upload(ctx context.Context, target string, size int64) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target, &zeros{left: size})
	if err != nil {
		return 0, err
	}
	req.ContentLength = size
	req.Header.Set("Content-Type", "application/octet-stream")
	req.Header.Set("filename", "zeros.bin")
	tr := &http.Transport{DisableKeepAlives: true, DisableCompression: true, WriteBufferSize: 256 << 10,
		ReadBufferSize: 64 << 10, ResponseHeaderTimeout: 2 * time.Minute}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, err
	}
	if resp.StatusCode == http.StatusOK && !bytes.Contains(body, []byte(`"data_id"`)) {
		return resp.StatusCode, errors.New("answer without a data_id: " + string(body))
	}
	return resp.StatusCode, nil
}
