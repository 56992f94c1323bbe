package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// verifyWhat names the check that a workload's rows need to have passed.
var verifyWhat = map[string]string{"limit": "limit answer", "forward": "forwarded poll", "upload": "upload", "storehit": "store hit"}

// verifyTargets are the targets each workload's check runs on.
var verifyTargets = map[string][]string{
	"limit":    {"bare503", "bare503t", "mdproxy", "nginx", "haproxy"},
	"forward":  {"bareproxy", "mdproxy-fwd", "nginx-fwd", "haproxy-fwd", "caddy"},
	"upload":   {"direct", "relay", "relay-splice", "bareproxy", "mdproxy", "mdproxy-bridge", "nginx", "haproxy", "caddy"},
	"storehit": {"mdproxy-bridge", "bareresult"},
}

// checkFunc checks that a target answers a workload as it should.
type checkFunc func(*bench, context.Context, *target) error

// workloadChecks are each workload's check; targetChecks, the checks of the targets that
// answer a workload otherwise (the bare server of a store hit's bytes stores nothing: it
// is polled, not sent a submission).
var (
	workloadChecks = map[string]checkFunc{
		"limit": (*bench).checkLimit, "forward": (*bench).checkForward,
		"upload": (*bench).checkUpload, "storehit": (*bench).checkStoreHit,
	}
	targetChecks = map[string]checkFunc{"bareresult": (*bench).checkBareResult}
)

// verify checks, with a Go client and before anything is measured, that every target
// answers each workload as it should; a target that does not gets no figures for it.
func (b *bench) verify(ctx context.Context) {
	// The store hit first: its callback is then the only one the stand-in makes.
	for _, w := range []string{"storehit", "limit", "forward", "upload"} {
		if !b.cfg.workloads[w] && !(w == "upload" && b.cfg.workloads["rss"]) {
			continue
		}
		var keys []string
		for _, key := range verifyTargets[w] {
			keys = append(keys, key)
			if strings.HasPrefix(key, "mdproxy") {
				for _, v := range b.cfg.variants {
					keys = append(keys, variantKey(key, v.name))
				}
			}
		}
		for _, key := range keys {
			t := b.targets[key]
			if t == nil || t.absent != "" {
				continue
			}
			check, ok := targetChecks[key]
			if !ok {
				check = workloadChecks[w]
			}
			err := check(b, ctx, t)
			b.verified = append(b.verified, verification{target: key, what: verifyWhat[w], err: err})
			if err != nil {
				b.logf("check %s %s: %v", key, verifyWhat[w], err)
			} else {
				b.logf("check %s %s: ok", key, verifyWhat[w])
			}
		}
	}
}

// checkLimit polls 200 times in a row: every answer must be the stand-in's result or
// the limit answer (503, mdproxy's body, Retry-After), at least one a 503, and no more
// let through than a limit of 50/s with a burst of 50 (100 for HAProxy's window) allows.
func (b *bench) checkLimit(ctx context.Context, t *target) error {
	want := result(benchID)
	var n200, n503 int
	start := time.Now()
	for range 200 {
		code, h, body, err := b.do(ctx, http.MethodGet, t.base+"/file/"+benchID, nil)
		if err != nil {
			return err
		}
		switch {
		case code == http.StatusOK && bytes.Equal(body, want):
			n200++
		case code == http.StatusServiceUnavailable && string(body) == limitBody && h.Get("Retry-After") != "":
			n503++
		default:
			return fmt.Errorf("answered %d %q (Retry-After %q), want 200 with the stand-in's result or 503 %s with Retry-After",
				code, trunc(body), h.Get("Retry-After"), limitBody)
		}
	}
	if n503 == 0 {
		return fmt.Errorf("no 503 in 200 polls in a row")
	}
	if (t.key == "bare503" || t.key == "bare503t") && n200 > 0 {
		return fmt.Errorf("%d answers 200, want only 503", n200)
	}
	if allowed := 100 + int(50*time.Since(start).Seconds()) + 1; n200 > allowed {
		return fmt.Errorf("%d of 200 polls let through, more than a limit of 50/s allows (%d)", n200, allowed)
	}
	return nil
}

// checkForward polls 50 times: every answer the stand-in's result, every poll reaching
// the stand-in.
func (b *bench) checkForward(ctx context.Context, t *target) error {
	before, err := b.stats(ctx)
	if err != nil {
		return err
	}
	if err := b.pollResult(ctx, t, 50); err != nil {
		return err
	}
	after, err := b.stats(ctx)
	if err != nil {
		return err
	}
	if n := after.Gets - before.Gets; n != 50 {
		return fmt.Errorf("the stand-in answered %d of 50 polls", n)
	}
	return nil
}

// checkUpload posts 4 MiB: answered 200 with a data_id, received whole at the stand-in
// (with its Content-Length: a re-chunked body counts as incomplete there).
func (b *bench) checkUpload(ctx context.Context, t *target) error {
	const size = 4 << 20
	before, err := b.stats(ctx)
	if err != nil {
		return err
	}
	code, err := upload(ctx, t.base+"/file", size)
	if err != nil {
		return err
	}
	if code != http.StatusOK {
		return fmt.Errorf("upload answered %d", code)
	}
	after, err := b.stats(ctx)
	if err != nil {
		return err
	}
	if c, n := after.UploadsComplete-before.UploadsComplete, after.UploadBytes-before.UploadBytes; c != 1 || n != size {
		return fmt.Errorf("the stand-in received %d bytes, %d uploads whole, want %d bytes in 1", n, c, size)
	}
	return nil
}

// checkStoreHit submits a file through mdproxy with the bridge on, waits for the
// stand-in's callback to be taken, polls the id: the result must come back without
// reaching the stand-in. The id is then the store-hit workload's.
func (b *bench) checkStoreHit(ctx context.Context, t *target) error {
	before, err := b.stats(ctx)
	if err != nil {
		return err
	}
	code, _, body, err := b.do(ctx, http.MethodPost, t.base+"/file", bytes.Repeat([]byte("x"), 1024))
	if err != nil {
		return err
	}
	var sub struct {
		DataID string `json:"data_id"`
	}
	if code != http.StatusOK || json.Unmarshal(body, &sub) != nil || sub.DataID == "" {
		return fmt.Errorf("submission answered %d %q", code, trunc(body))
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, err := b.stats(ctx)
		if err != nil {
			return err
		}
		if st.CallbacksFailed > before.CallbacksFailed {
			return fmt.Errorf("mdproxy refused the stand-in's callback (see its log)")
		}
		if st.CallbacksOK > before.CallbacksOK {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no callback delivered within 10 s of the submission")
		}
		time.Sleep(20 * time.Millisecond)
	}
	mid, err := b.stats(ctx)
	if err != nil {
		return err
	}
	for range 20 {
		code, _, body, err = b.do(ctx, http.MethodGet, t.base+"/file/"+sub.DataID, nil)
		if err != nil {
			return err
		}
		if code != http.StatusOK || !bytes.Equal(body, result(sub.DataID)) {
			return fmt.Errorf("poll of the stored id answered %d %q, want 200 with its result", code, trunc(body))
		}
	}
	after, err := b.stats(ctx)
	if err != nil {
		return err
	}
	if n := after.Gets - mid.Gets; n != 0 {
		return fmt.Errorf("%d of 20 polls of the stored id reached the stand-in: not a store hit", n)
	}
	b.storedIDs[t.key] = sub.DataID
	return nil
}

// checkBareResult polls the bare server of a store hit's bytes 20 times: every answer
// 200 with the stand-in's result, as a store hit's.
func (b *bench) checkBareResult(ctx context.Context, t *target) error {
	return b.pollResult(ctx, t, 20)
}

// pollResult polls t n times for the bench's id: every answer must be 200 with the
// stand-in's result.
func (b *bench) pollResult(ctx context.Context, t *target, n int) error {
	want := result(benchID)
	for range n {
		code, _, body, err := b.do(ctx, http.MethodGet, t.base+"/file/"+benchID, nil)
		if err != nil {
			return err
		}
		if code != http.StatusOK || !bytes.Equal(body, want) {
			return fmt.Errorf("answered %d %q, want 200 with the stand-in's result", code, trunc(body))
		}
	}
	return nil
}

func trunc(b []byte) string {
	if len(b) > 200 {
		return string(b[:200]) + "..."
	}
	return string(b)
}
