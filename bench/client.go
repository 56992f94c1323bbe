package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Workload is the client side of the published benchmark's test steps
// (bench/PUBLISHED.md): turns of TurnSize concurrent POST /file, TurnInterval
// apart, until Submissions files are submitted; rounds of GET /file/{data_id}, one of
// every outstanding submission, FetchInterval apart, until every scan is complete (a
// 503 counts as a fetch error); or, with CallbackURL set, no fetching at all: the
// results arrive by callback. Intervals are in virtual time and divided by Speedup.
type Workload struct {
	Submissions  int           // 2000 in the published benchmark
	TurnSize     int           // 10
	TurnInterval time.Duration // 1 s
	// FetchInterval is the pause between fetch rounds (5 s): a round fetches every
	// outstanding data_id once, FetchConcurrency at a time, and the next round starts
	// FetchInterval after the last answer of the previous one, as a polling loop that
	// sleeps between rounds does.
	FetchInterval time.Duration
	// FetchConcurrency is how many fetches are in flight at most: the client's
	// connection pool. The published client fetched "concurrently"; 120 reproduces its
	// fetch rates (see bench/results).
	FetchConcurrency int
	Speedup          float64 // virtual seconds per real second; 1 against a real Core
	APIKey           string  // sent as the apikey header when not empty
	// CallbackURL, when set, is sent as the callbackurl header of every submission and
	// no fetch is made (the Webhook case); Callbacks must receive the results.
	CallbackURL string
	Callbacks   *Receiver
	// BurstSize, when above 0, makes the submissions come in bursts: once BurstSize
	// more files are accepted the client pauses BurstGap (virtual) before the next turn
	// (BurstyWorkload).
	BurstSize int
	BurstGap  time.Duration
	// CoreQueue is the scan queue, in files, of the Core the workload is meant for
	// (Core's max_queue_per_agent): mdbench gives the emulator this CORESIM_QUEUE_SIZE
	// unless that is set. 0: the emulator's, 4000 as in the published benchmark.
	CoreQueue int
	// ExpectContinue sends each submission with "Expect: 100-continue" (RFC 9110,
	// section 10.1.1), so that one Core refuses with its queue full is answered before
	// its body is sent.
	ExpectContinue bool
	// Deadline bounds the whole run in virtual time (0: 6 hours).
	Deadline time.Duration
	// Progress, if not nil, is called about twice a second with the counts so far.
	Progress func(submitted, completed, fetchErrors int)
}

// Submission is what the client knows of one submission.
type Submission struct {
	DataID    string
	File      string
	Sent      time.Time // real time the POST /file was sent
	Received  time.Time // real time the complete result reached the client
	Objects   int       // the file and its extracted parts, from the result
	Verdict   int       // the result's scan_all_result_i; -1 when it has none
	Uploaded  time.Time // Core's upload_timestamp
	Completed time.Time // Core's upload_timestamp + queue_time + processing_time
}

// Outcome is the raw record of one run of a Workload.
type Outcome struct {
	Start, End            time.Time // real time of the first submission and the last result
	FirstFetch, LastFetch time.Time // real time
	FetchOK, FetchErrors  int64     // accepted fetches; fetches answered 503
	FetchOther            int64     // fetches that failed otherwise
	SubmitRetries         int64     // submissions refused (503) and sent again
	// CorePolls is how many polls (GET /file/{data_id}) reached Core, from the client
	// or from mdproxy; -1 when not counted. Set by RunScenario.
	CorePolls   int64
	Submissions []*Submission
	Speedup     float64
}

// analysis is the part of Core's analysis result the client reads.
type analysis struct {
	DataID   string `json:"data_id"`
	FileInfo struct {
		UploadTimestamp string `json:"upload_timestamp"`
	} `json:"file_info"`
	ScanResults struct {
		ProgressPercentage *int `json:"progress_percentage"`
		ScanAllResultI     *int `json:"scan_all_result_i"`
	} `json:"scan_results"`
	ProcessInfo struct {
		ProgressPercentage *int  `json:"progress_percentage"`
		QueueTime          int64 `json:"queue_time"`
		ProcessingTime     int64 `json:"processing_time"`
	} `json:"process_info"`
	ExtractedFiles *struct {
		FilesExtractedCount int `json:"files_extracted_count"`
	} `json:"extracted_files"`
}

// complete reports whether the result is final: progress 100 in process_info (what
// OPSWAT's own integrations read) or in scan_results (what the spec names).
func (a *analysis) complete() bool {
	p := a.ProcessInfo.ProgressPercentage
	if p == nil {
		p = a.ScanResults.ProgressPercentage
	}
	return p != nil && *p >= 100
}

// record fills s from a complete result.
func (a *analysis) record(s *Submission, at time.Time) {
	s.Received = at
	s.Objects = 1
	s.Verdict = -1
	if v := a.ScanResults.ScanAllResultI; v != nil {
		s.Verdict = *v
	}
	if a.ExtractedFiles != nil {
		s.Objects += a.ExtractedFiles.FilesExtractedCount
	}
	if t, err := time.Parse(time.RFC3339Nano, a.FileInfo.UploadTimestamp); err == nil {
		s.Uploaded = t
		s.Completed = t.Add(time.Duration(a.ProcessInfo.QueueTime+a.ProcessInfo.ProcessingTime) * time.Millisecond)
	}
}

// ErrUnreachable wraps the error of a Core that refuses connections or does not answer.
var ErrUnreachable = errors.New("core unreachable")

// Run plays w against the Core (or mdproxy) at baseURL with files, and returns what
// happened. It returns an error wrapping ErrUnreachable as soon as a submission cannot
// reach Core, and an error when the deadline passes before every result arrived.
func (w Workload) Run(ctx context.Context, baseURL string, files []DataFile) (*Outcome, error) {
	return w.RunSpread(ctx, []string{baseURL}, files)
}

// RunSpread is Run with the requests spread over several mdproxy replicas in front of
// one Core, at baseURLs: the submissions round-robin, each to the next replica in
// turn, and so are the polls: the i-th poll of fetch round k goes to replica
// (i+k) mod len(baseURLs), so that a file's successive polls visit every replica,
// whichever took its submission (the hard case for a limit the replicas share).
func (w Workload) RunSpread(ctx context.Context, baseURLs []string, files []DataFile) (*Outcome, error) {
	if len(files) == 0 {
		return nil, errNoFiles
	}
	if len(baseURLs) == 0 {
		return nil, errors.New("no URL to send the requests to")
	}
	if w.Speedup <= 0 {
		w.Speedup = 1
	}
	if w.Deadline == 0 {
		w.Deadline = 6 * time.Hour
	}
	real := func(v time.Duration) time.Duration { return time.Duration(float64(v) / w.Speedup) }
	ctx, cancel := context.WithTimeout(ctx, real(w.Deadline))
	defer cancel()

	// A pool of FetchConcurrency + TurnSize connections to each replica: the fetches
	// in flight are bounded by FetchConcurrency over all of them (fetchLoop), so the
	// client offers the same load however many replicas share it.
	tr := &http.Transport{
		MaxIdleConnsPerHost: w.FetchConcurrency + w.TurnSize,
		MaxConnsPerHost:     w.FetchConcurrency + w.TurnSize,
		IdleConnTimeout:     90 * time.Second,
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
	}
	if w.ExpectContinue {
		tr.ExpectContinueTimeout = time.Second
	}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}

	c := &runState{w: w, client: client, bases: baseURLs, out: &Outcome{Speedup: w.Speedup}}
	c.byID = map[string]*Submission{}
	if w.Callbacks != nil {
		w.Callbacks.mu.Lock()
		w.Callbacks.deliver = c.callback
		w.Callbacks.mu.Unlock()
	}
	c.out.Start = time.Now()

	var wg sync.WaitGroup
	errc := make(chan error, 2)
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := c.submitAll(ctx, files, real(w.TurnInterval), real(w.BurstGap)); err != nil {
			errc <- err
			cancel()
		}
	}()
	if w.CallbackURL == "" {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.fetchLoop(ctx, real(w.FetchInterval))
		}()
	}
	// Wait until every submission has its result, reporting progress on the way.
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	var runErr error
loop:
	for {
		select {
		case err := <-errc:
			runErr = err
			break loop
		case <-ctx.Done():
			runErr = fmt.Errorf("deadline of %v (virtual) passed with %d of %d results received", w.Deadline, c.completed.Load(), w.Submissions)
			break loop
		case <-c.allDone():
			break loop
		case <-tick.C:
			if w.Progress != nil {
				w.Progress(int(c.submitted.Load()), int(c.completed.Load()), int(atomic.LoadInt64(&c.out.FetchErrors)))
			}
		}
	}
	cancel()
	wg.Wait()
	if w.Progress != nil {
		w.Progress(int(c.submitted.Load()), int(c.completed.Load()), int(atomic.LoadInt64(&c.out.FetchErrors)))
	}
	if runErr != nil {
		return nil, runErr
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range c.out.Submissions {
		if s.Received.After(c.out.End) {
			c.out.End = s.Received
		}
	}
	return c.out, nil
}

// runState is one run's shared state.
type runState struct {
	w      Workload
	client *http.Client
	bases  []string // the Core or the mdproxy replicas the requests are spread over
	out    *Outcome

	mu    sync.Mutex
	byID  map[string]*Submission
	early map[string]*analysis // results that came before their POST's answer was read
	done  chan struct{}

	submitted, completed atomic.Int64
}

func (c *runState) allDone() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done == nil {
		c.done = make(chan struct{})
	}
	return c.done
}

// finish records a complete result once. A callback can arrive before the client has
// read the data_id from its POST's answer: it is kept until then.
func (c *runState) finish(a *analysis) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.byID[a.DataID]
	if s == nil {
		if c.early == nil {
			c.early = map[string]*analysis{}
		}
		c.early[a.DataID] = a
		return
	}
	c.finishLocked(s, a, time.Now())
}

// finishLocked records a for s; the caller holds c.mu.
func (c *runState) finishLocked(s *Submission, a *analysis, now time.Time) {
	if !s.Received.IsZero() {
		return
	}
	a.record(s, now)
	if n := c.completed.Add(1); int(n) == c.w.Submissions {
		if c.done == nil {
			c.done = make(chan struct{})
		}
		close(c.done)
	}
}

// callback receives a result delivered by Core.
func (c *runState) callback(body []byte) {
	var a analysis
	if json.Unmarshal(body, &a) == nil && a.complete() {
		c.finish(&a)
	}
}

// submitAll sends the turns. A submission refused with 503 (queue full) is sent again in
// the next turn; one that cannot reach Core stops the run.
func (c *runState) submitAll(ctx context.Context, files []DataFile, interval, gap time.Duration) error {
	next := 0
	t := time.NewTicker(interval)
	defer t.Stop()
	burstEnd := c.w.Submissions // the submissions accepted when the burst under way ends
	if c.w.BurstSize > 0 {
		burstEnd = min(c.w.BurstSize, c.w.Submissions)
	}
	for int(c.submitted.Load()) < c.w.Submissions {
		n := min(c.w.TurnSize, burstEnd-int(c.submitted.Load()))
		var wg sync.WaitGroup
		errs := make(chan error, n)
		for range n {
			f := files[next%len(files)]
			base := c.bases[next%len(c.bases)] // round-robin over the replicas
			next++
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := c.submit(ctx, base, f); err != nil {
					errs <- err
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if errors.Is(err, ErrUnreachable) {
				return err
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if done := int(c.submitted.Load()); done >= burstEnd && done < c.w.Submissions {
			burstEnd = min(burstEnd+c.w.BurstSize, c.w.Submissions)
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(gap):
			}
			t.Reset(interval)
		}
	}
	return nil
}

// submit sends f to the Core or replica at base.
func (c *runState) submit(ctx context.Context, base string, f DataFile) error {
	fh, err := os.Open(f.Path)
	if err != nil {
		return err
	}
	defer fh.Close()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/file", fh)
	if err != nil {
		return err
	}
	req.ContentLength = f.Size
	req.Header.Set("Content-Type", "application/octet-stream")
	req.Header.Set("filename", f.Name)
	if c.w.ExpectContinue {
		req.Header.Set("Expect", "100-continue")
	}
	if c.w.APIKey != "" {
		req.Header.Set("apikey", c.w.APIKey)
	}
	if c.w.CallbackURL != "" {
		req.Header.Set("callbackurl", c.w.CallbackURL)
	}
	sent := time.Now()
	resp, err := c.client.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		if errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || isTimeout(err) {
			return fmt.Errorf("%w: POST %s/file: %v", ErrUnreachable, base, err)
		}
		return err
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusServiceUnavailable:
		atomic.AddInt64(&c.out.SubmitRetries, 1)
		return nil
	case resp.StatusCode != http.StatusOK:
		return fmt.Errorf("%w: POST %s/file answered %d %s", ErrUnreachable, base, resp.StatusCode, bytes.TrimSpace(body))
	}
	var r struct {
		DataID string `json:"data_id"`
	}
	if err := json.Unmarshal(body, &r); err != nil || r.DataID == "" {
		return fmt.Errorf("%w: POST %s/file answered no data_id: %s", ErrUnreachable, base, bytes.TrimSpace(body))
	}
	s := &Submission{DataID: r.DataID, File: f.Name, Sent: sent}
	c.submitted.Add(1)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.byID[r.DataID] = s
	c.out.Submissions = append(c.out.Submissions, s)
	if a := c.early[r.DataID]; a != nil {
		delete(c.early, r.DataID)
		c.finishLocked(s, a, time.Now())
	}
	return nil
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// fetchLoop runs fetch rounds, interval apart, until ctx ends.
func (c *runState) fetchLoop(ctx context.Context, interval time.Duration) {
	sem := make(chan struct{}, c.w.FetchConcurrency)
	for round := 0; ; round++ {
		select {
		case <-ctx.Done():
			return
		case <-time.After(interval):
		}
		c.mu.Lock()
		var ids []string
		for id, s := range c.byID {
			if s.Received.IsZero() {
				ids = append(ids, id)
			}
		}
		c.mu.Unlock()
		slices.Sort(ids) // a stable order: oldest submissions are not favoured by chance
		var wg sync.WaitGroup
		for i, id := range ids {
			// Round-robin over the replicas, shifted by one each round: a file's
			// polls visit every replica in turn.
			base := c.bases[(i+round)%len(c.bases)]
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
			}
			if ctx.Err() != nil {
				break
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				c.fetch(ctx, base, id)
			}()
		}
		wg.Wait()
	}
}

// fetch polls one data_id once, at the Core or replica at base.
func (c *runState) fetch(ctx context.Context, base, id string) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/file/"+id, nil)
	if err != nil {
		return
	}
	if c.w.APIKey != "" {
		req.Header.Set("apikey", c.w.APIKey)
	}
	now := time.Now()
	c.mu.Lock()
	if c.out.FirstFetch.IsZero() {
		c.out.FirstFetch = now
	}
	c.mu.Unlock()
	resp, err := c.client.Do(req)
	if err != nil {
		if ctx.Err() == nil {
			atomic.AddInt64(&c.out.FetchOther, 1)
		}
		return
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	c.mu.Lock()
	c.out.LastFetch = time.Now()
	c.mu.Unlock()
	switch {
	case resp.StatusCode == http.StatusServiceUnavailable:
		atomic.AddInt64(&c.out.FetchErrors, 1)
		return
	case resp.StatusCode != http.StatusOK || err != nil:
		atomic.AddInt64(&c.out.FetchOther, 1)
		return
	}
	atomic.AddInt64(&c.out.FetchOK, 1)
	var a analysis
	if json.Unmarshal(body, &a) == nil && a.complete() {
		if a.DataID == "" {
			a.DataID = id
		}
		c.finish(&a)
	}
}

// Receiver is the HTTP endpoint that takes Core's callbacks (the Webhook case): it
// answers 200 to every POST and hands the body to the run.
type Receiver struct {
	deliver func(body []byte)
	mu      sync.Mutex
}

// ServeHTTP takes one callback.
func (r *Receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(io.LimitReader(req.Body, 64<<20))
	if err != nil {
		http.Error(w, "bad body", http.StatusBadRequest)
		return
	}
	r.mu.Lock()
	deliver := r.deliver
	r.mu.Unlock()
	if deliver != nil {
		deliver(body)
	}
	w.WriteHeader(http.StatusOK)
}

// BurstyWorkload is SeedWorkload's client and files with its submissions in two bursts
// of 1000, 8 minutes apart, against a Core whose scan queue holds 250 files: the seed's
// turns of 10 a second fill the queue in half a minute, then Core refuses most of each
// turn ("Server is too busy", sent again the next turn) for about ten minutes while it
// scans a file every 0.8 s, its queue above 80% of its slots throughout; the queue then
// drains and Core idles until the next burst. Submissions ask "Expect: 100-continue",
// so that a refused one sends no body.
var BurstyWorkload = Workload{
	Submissions: 2000, TurnSize: 10, TurnInterval: time.Second,
	BurstSize: 1000, BurstGap: 8 * time.Minute, CoreQueue: 250, ExpectContinue: true,
	FetchInterval: 5 * time.Second, FetchConcurrency: 120,
}

// Scaled returns w with n submissions, its bursts and its Core's scan queue in
// proportion (at least 1 file each), for runs smaller than the workload's own.
func (w Workload) Scaled(n int) Workload {
	scale := func(v int) int {
		if v <= 0 {
			return v
		}
		return max(v*n/w.Submissions, 1)
	}
	w.BurstSize, w.CoreQueue = scale(w.BurstSize), scale(w.CoreQueue)
	w.Submissions = n
	return w
}

// SeedWorkload is the published benchmark's client: 2000 submissions in turns of 10,
// 1 s apart; fetch rounds 5 s apart.
var SeedWorkload = Workload{
	Submissions: 2000, TurnSize: 10, TurnInterval: time.Second,
	FetchInterval: 5 * time.Second, FetchConcurrency: 120,
}
