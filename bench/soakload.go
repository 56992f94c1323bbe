package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// soakLoad drives a SoakMix against mdproxy: one scheduler goroutine a kind of
// request, each starting its requests at a steady rate in goroutines of their own.
// Uploads and polls go through the benchmark client (runState).
type soakLoad struct {
	mix   SoakMix
	addr  string // mdproxy's host:port, for raw connections
	files []DataFile
	tr    *http.Transport
	rs    *runState

	ctx      context.Context // the requests' context
	cancel   context.CancelFunc
	quit     chan struct{} // closed: schedulers start no more requests
	sem      chan struct{}
	sched    sync.WaitGroup
	inflight sync.WaitGroup
	n        atomic.Int64 // a counter for files, data_ids and apikeys
	c        SoakClient   // updated atomically
}

func newSoakLoad(cfg SoakConfig, base, addr string) *soakLoad {
	tr := &http.Transport{
		MaxIdleConnsPerHost: cfg.Mix.MaxInFlight,
		IdleConnTimeout:     90 * time.Second,
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
	}
	rs := &runState{client: &http.Client{Transport: tr}, bases: []string{base},
		out: &Outcome{Speedup: 1}, byID: map[string]*Submission{}}
	return &soakLoad{mix: cfg.Mix, addr: addr, files: cfg.Files, tr: tr, rs: rs,
		quit: make(chan struct{}), sem: make(chan struct{}, max(1, cfg.Mix.MaxInFlight))}
}

// start starts the schedulers; requests end when ctx does.
func (l *soakLoad) start(ctx context.Context) {
	l.ctx, l.cancel = context.WithCancel(ctx)
	for _, k := range []struct {
		rate float64
		do   func(context.Context)
	}{
		{l.mix.UploadsPerS, l.upload},
		{l.mix.PollsPerS, l.poll},
		{l.mix.CanceledPollsPerS, l.canceledPoll},
		{l.mix.UnknownPollsPerS, l.unknownPoll},
		{l.mix.AbortedUploadsPerS, l.abortedUpload},
	} {
		if k.rate > 0 {
			l.sched.Add(1)
			go l.every(time.Duration(float64(time.Second)/k.rate), k.do)
		}
	}
}

// stop stops the schedulers, waits for the requests in flight to end (each has its
// own timeout) and closes the idle connections.
func (l *soakLoad) stop() {
	close(l.quit)
	l.sched.Wait()
	l.inflight.Wait()
	l.cancel()
	l.tr.CloseIdleConnections()
}

// counts returns the client's counts; call after stop.
func (l *soakLoad) counts() SoakClient {
	c := l.c
	o := l.rs.out
	c.Uploads, c.UploadsRefused = l.rs.submitted.Load(), o.SubmitRetries
	c.Polls, c.PollsLimited, c.PollErrors = o.FetchOK, o.FetchErrors, o.FetchOther+c.PollErrors
	return c
}

func (l *soakLoad) every(period time.Duration, do func(context.Context)) {
	defer l.sched.Done()
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-l.quit:
			return
		case <-l.ctx.Done():
			return
		case <-t.C:
		}
		select {
		case l.sem <- struct{}{}:
		default:
			atomic.AddInt64(&l.c.Skipped, 1)
			continue
		}
		l.inflight.Add(1)
		go func() {
			defer l.inflight.Done()
			defer func() { <-l.sem }()
			do(l.ctx)
		}()
	}
}

func (l *soakLoad) file() DataFile { return l.files[int(l.n.Add(1)-1)%len(l.files)] }

func (l *soakLoad) apikey() string { return fmt.Sprintf("soak-client-%d", l.n.Add(1)) }

// recentID returns one of the PollWindow most recent data_ids, in turn; "" before the
// first submission.
func (l *soakLoad) recentID() string {
	l.rs.mu.Lock()
	defer l.rs.mu.Unlock()
	subs := l.rs.out.Submissions
	win := min(len(subs), l.mix.PollWindow)
	if win == 0 {
		return ""
	}
	return subs[len(subs)-win+int(l.n.Add(1)%int64(win))].DataID
}

func (l *soakLoad) upload(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := l.rs.submit(ctx, l.rs.bases[0], l.file()); err != nil {
		atomic.AddInt64(&l.c.UploadErrors, 1)
	}
}

func (l *soakLoad) poll(ctx context.Context) {
	id := l.recentID()
	if id == "" {
		return
	}
	tctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	l.rs.fetch(tctx, l.rs.bases[0], id)
	if tctx.Err() != nil && ctx.Err() == nil {
		atomic.AddInt64(&l.c.PollErrors, 1) // fetch does not count its own timeout
	}
}

// get sends GET path with a new apikey within timeout and returns the status, the
// body read and closed.
func (l *soakLoad) get(ctx context.Context, path string, timeout time.Duration) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, l.rs.bases[0]+path, nil)
	if err != nil {
		return 0, err
	}
	req.Header.Set("apikey", l.apikey())
	resp, err := l.rs.client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, err = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, err
}

func (l *soakLoad) canceledPoll(ctx context.Context) {
	id := l.recentID()
	if id == "" {
		return
	}
	_, err := l.get(ctx, "/file/"+id, l.mix.CanceledPollTimeout)
	switch {
	case err == nil:
		atomic.AddInt64(&l.c.CanceledPollsAnswered, 1)
	case errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil:
		atomic.AddInt64(&l.c.CanceledPolls, 1)
	case ctx.Err() == nil:
		atomic.AddInt64(&l.c.PollErrors, 1)
	}
}

func (l *soakLoad) unknownPoll(ctx context.Context) {
	var b [16]byte
	_, _ = rand.Read(b[:])
	code, err := l.get(ctx, "/file/"+hex.EncodeToString(b[:]), 30*time.Second)
	switch {
	case err == nil && code == http.StatusNotFound:
		atomic.AddInt64(&l.c.UnknownPolls, 1)
	case err == nil:
		atomic.AddInt64(&l.c.UnknownPollsOther, 1)
	case ctx.Err() == nil:
		atomic.AddInt64(&l.c.PollErrors, 1)
	}
}

// abortedUpload announces a file's Content-Length on a raw connection, sends half of
// the file, waits AbortAfter and closes the connection.
func (l *soakLoad) abortedUpload(ctx context.Context) {
	f := l.file()
	err := func() error {
		fh, err := os.Open(f.Path)
		if err != nil {
			return err
		}
		defer fh.Close()
		conn, err := (&net.Dialer{Timeout: 5 * time.Second}).DialContext(ctx, "tcp", l.addr)
		if err != nil {
			return err
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := fmt.Fprintf(conn, "POST /file HTTP/1.1\r\nHost: %s\r\nContent-Type: application/octet-stream\r\nfilename: %s\r\nContent-Length: %d\r\n\r\n",
			l.addr, f.Name, f.Size); err != nil {
			return err
		}
		if _, err := io.CopyN(conn, fh, f.Size/2); err != nil {
			return err
		}
		t := time.NewTimer(l.mix.AbortAfter)
		defer t.Stop()
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		return nil
	}()
	switch {
	case err == nil:
		atomic.AddInt64(&l.c.AbortedUploads, 1)
	case ctx.Err() == nil:
		atomic.AddInt64(&l.c.UploadErrors, 1)
	}
}
