package coresim

import (
	"bytes"
	"encoding/json"
	"net"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestCallbackRetries checks the delivery schedule of callbacks on virtual time: the
// first attempt when the scan completes, the first retry CALLBACK_DELAY later, each
// next one CALLBACK_INCREASE later than the previous gap, at most CALLBACK_RETRIES
// retries; the body is the complete result; the outcome is counted and reported by
// GET /file/webhook/{data_id}.
func TestCallbackRetries(t *testing.T) {
	s := time.Second
	for _, tc := range []struct {
		name            string
		codes           []int // answered by the receiver, attempt after attempt
		retries         int
		delay, increase time.Duration
		wantAt          []time.Duration // after completion
		wantDelivered   bool
	}{
		{"fails twice, then succeeds", []int{500, 500, 200}, 3, s, s, []time.Duration{0, s, 3 * s}, true},
		{"always fails", []int{500}, 3, s, s, []time.Duration{0, s, 3 * s, 6 * s}, false},
		{"other delays, 503 and 404", []int{503, 404, 204}, 5, 2 * s, s / 2, []time.Duration{0, 2 * s, 4*s + s/2}, true},
		{"no increase", []int{500}, 2, 3 * s, 0, []time.Duration{0, 3 * s, 6 * s}, false},
		{"no retry", []int{500}, 0, s, s, []time.Duration{0}, false},
		{"succeeds at once", []int{200}, 3, s, s, []time.Duration{0}, true},
		{"a redirect is not a success", []int{302}, 1, s, s, []time.Duration{0, s}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := rigConfig(t)
			cfg.CallbackRetries, cfg.CallbackDelay, cfg.CallbackIncrease = tc.retries, tc.delay, tc.increase
			r := newRig(t, cfg)
			recv := newHookReceiver(t, r.sim, tc.codes...)
			hookURL := recv.srv.URL + "/hook/path"
			id := r.mustSubmit([]byte("a file with a callback"), map[string]string{"callbackurl": hookURL})

			const step = 100 * time.Millisecond
			var t0 time.Duration
			for range 200 { // 20 s: the last attempt and a long quiet time after it
				if r.callbackStep(step) && t0 == 0 {
					t0 = r.sim.model.Now() // completion: the step that made the first attempt
				}
			}
			if t0 != step {
				t.Fatalf("first callback attempt after step ending at %v, want at the scan's completion, %v", t0, step)
			}
			var want []time.Duration
			for _, d := range tc.wantAt {
				want = append(want, t0+d)
			}
			got := recv.got()
			var at []time.Duration
			for _, a := range got {
				at = append(at, a.at)
			}
			if !slices.Equal(at, want) {
				t.Errorf("callback attempts at %v (virtual), want %v", at, want)
			}

			result := r.do(http.MethodGet, "/file/"+id, nil, nil)
			for i, a := range got {
				if a.method != http.MethodPost || a.contentType != "application/json" {
					t.Errorf("attempt %d: %s with Content-Type %q, want POST with application/json", i+1, a.method, a.contentType)
				}
				var res analysisResult
				if err := json.Unmarshal(a.body, &res); err != nil {
					t.Fatalf("attempt %d: body %q is not JSON: %v", i+1, a.body, err)
				}
				if res.DataID != id || res.ProcessInfo.ProgressPercent != 100 || res.ScanResults.ProgressPercent != 100 || res.ProcessInfo.Result != "Allowed" {
					t.Errorf("attempt %d: body has data_id %q, progress %d/%d, result %q, want %q, 100/100, Allowed",
						i+1, res.DataID, res.ProcessInfo.ProgressPercent, res.ScanResults.ProgressPercent, res.ProcessInfo.Result, id)
				}
				if !bytes.Equal(a.body, result.body) {
					t.Errorf("attempt %d: body = %s, want the complete result of GET /file/{data_id}: %s", i+1, a.body, result.body)
				}
			}

			// Delivered: every attempt but the last failed; otherwise every one did.
			delivered, failed, ok, errors := 1.0, 0.0, 1.0, float64(len(want)-1)
			if !tc.wantDelivered {
				delivered, failed, ok, errors = 0, 1, 0, float64(len(want))
			}
			lastCode := tc.codes[min(len(want), len(tc.codes))-1]
			for _, m := range []struct {
				name   string
				vec    *prometheus.CounterVec
				result string
				want   float64
			}{
				{"coresim_callbacks_total", r.sim.m.callbacks, "delivered", delivered},
				{"coresim_callbacks_total", r.sim.m.callbacks, "failed", failed},
				{"coresim_callback_attempts_total", r.sim.m.callbackAttempts, "ok", ok},
				{"coresim_callback_attempts_total", r.sim.m.callbackAttempts, "error", errors},
			} {
				if got := testutil.ToFloat64(m.vec.WithLabelValues(m.result)); got != m.want {
					t.Errorf("%s{result=%q} = %v, want %v", m.name, m.result, got, m.want)
				}
			}

			var st webhookStatus
			if code := r.get("/file/webhook/"+id, &st); code != http.StatusOK {
				t.Fatalf("GET /file/webhook/{data_id} = %d, want 200", code)
			}
			wantSt := webhookStatus{DataID: id, URL: hookURL, StatusCode: lastCode, RequestTime: r.sim.timestamp(want[len(want)-1]),
				Attempts: len(want), Delivered: tc.wantDelivered}
			if st != wantSt {
				t.Errorf("GET /file/webhook/{data_id} = %+v, want %+v", st, wantSt)
			}
		})
	}
}

// TestCallbackUnreachable checks that a receiver that does not answer (a closed port)
// fails every attempt, is retried on schedule, and ends counted as failed.
func TestCallbackUnreachable(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + l.Addr().String() + "/hook"
	l.Close()

	cfg := rigConfig(t)
	cfg.CallbackRetries, cfg.CallbackDelay, cfg.CallbackIncrease = 2, time.Second, time.Second
	r := newRig(t, cfg)
	id := r.mustSubmit([]byte("nobody listens"), map[string]string{"callbackurl": closed})
	var at []time.Duration
	for range 100 {
		if r.callbackStep(100 * time.Millisecond) {
			at = append(at, r.sim.model.Now())
		}
	}
	ms := time.Millisecond
	if want := []time.Duration{100 * ms, 1100 * ms, 3100 * ms}; !slices.Equal(at, want) {
		t.Errorf("attempts in the steps ending at %v, want %v", at, want)
	}
	if got := testutil.ToFloat64(r.sim.m.callbackAttempts.WithLabelValues("error")); got != 3 {
		t.Errorf(`coresim_callback_attempts_total{result="error"} = %v, want 3`, got)
	}
	if got := testutil.ToFloat64(r.sim.m.callbacks.WithLabelValues("failed")); got != 1 {
		t.Errorf(`coresim_callbacks_total{result="failed"} = %v, want 1`, got)
	}
	var st webhookStatus
	r.get("/file/webhook/"+id, &st)
	if st.StatusCode != 0 || st.Attempts != 3 || st.Delivered {
		t.Errorf("GET /file/webhook/{data_id} = %+v, want status_code 0 (no answer), 3 attempts, not delivered", st)
	}
}

// TestCallbackURL checks which callbackurl values POST /file accepts, and that the
// webhook status exists only for a file submitted with one.
func TestCallbackURL(t *testing.T) {
	r := newRig(t, rigConfig(t))
	for _, tc := range []struct {
		url  string
		want int
	}{
		{"http://127.0.0.1:1/x", http.StatusOK},
		{"https://hooks.example:8443/a/b?c=d", http.StatusOK},
		{"http://host", http.StatusOK},
		{"ftp://host/x", http.StatusBadRequest},
		{"http://", http.StatusBadRequest},
		{"http://:80/x", http.StatusBadRequest},
		{"/relative/path", http.StatusBadRequest},
		{"not a url", http.StatusBadRequest},
	} {
		code, msg := r.submit([]byte("x"), map[string]string{"callbackurl": tc.url})
		if code != tc.want {
			t.Errorf("POST /file with callbackurl %q = %d %q, want %d", tc.url, code, msg, tc.want)
		}
		if tc.want == http.StatusBadRequest && msg != "Callback url is invalid." {
			t.Errorf("POST /file with callbackurl %q: err %q, want %q", tc.url, msg, "Callback url is invalid.")
		}
	}
	id := r.mustSubmit([]byte("no callback"), nil)
	if code := r.get("/file/webhook/"+id, nil); code != http.StatusNotFound {
		t.Errorf("GET /file/webhook/{data_id} of a file without callbackurl = %d, want 404", code)
	}
	// Before the scan completes, the status exists and reports no attempt.
	hooked := r.mustSubmit([]byte("a callback not yet due"), map[string]string{"callbackurl": "http://127.0.0.1:1/x"})
	var st webhookStatus
	if code := r.get("/file/webhook/"+hooked, &st); code != http.StatusOK || st.Attempts != 0 || st.StatusCode != 0 {
		t.Errorf("GET /file/webhook/{data_id} before completion = %d %+v, want 200, no attempt", code, st)
	}
}
