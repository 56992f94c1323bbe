package coresim

import (
	"encoding/json"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
)

// Handler returns Core's REST API as the emulator serves it. Unknown routes answer
// 404 {"err":"Not found"}; a known route asked with a method it does not serve answers
// 405 {"err":"Method not allowed"} with an Allow header listing those it does.
func (s *Sim) Handler() http.Handler {
	a := &api{s: s}
	r := chi.NewRouter()
	r.Use(middleware.GetHead) // HEAD is answered as GET, without a body
	r.NotFound(func(w http.ResponseWriter, _ *http.Request) { writeErr(w, http.StatusNotFound, "Not found") })
	r.MethodNotAllowed(func(w http.ResponseWriter, req *http.Request) {
		w.Header().Set("Allow", strings.Join(allowed(r, req), ", "))
		writeErr(w, http.StatusMethodNotAllowed, "Method not allowed")
	})
	r.Post("/login", a.login)
	r.Get("/readyz", a.readyz)
	r.Group(func(r chi.Router) {
		r.Use(a.auth)
		r.Post("/logout", a.logout)
		r.Post("/file", a.submit)
		r.Get("/file/rules", a.rules)
		r.Post("/file/batch", a.batchOpen)
		r.Get("/file/batch/{batch_id}", a.batchStatus)
		r.Post("/file/batch/{batch_id}/close", a.batchClose)
		r.Get("/file/batch/{batch_id}/certificate", a.batchCertificate)
		r.Get("/file/converted/{data_id}", a.converted)
		r.Get("/file/webhook/{data_id}", a.webhookStatus)
		r.Get("/file/{data_id}", a.result)
		r.Post("/file/{data_id}/cancel", a.cancel)
		r.Get("/hash/{hash}", a.hashLookup)
		r.Get("/version", a.version)
		r.Get("/stat/nodes", a.statNodes)
		r.Get("/stat/engines", a.statEngines)
	})
	return r
}

type api struct{ s *Sim }

// methods are the request methods of RFC 9110 and PATCH, in the order an Allow header
// lists them.
var methods = []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
	http.MethodDelete, http.MethodOptions, http.MethodTrace, http.MethodConnect}

// allowed returns the methods that mux serves at req's path, for the Allow header of a
// 405 (RFC 9110 §15.5.6): those it has a route for, and HEAD where it has GET's, which
// middleware.GetHead answers. The path is the one mux routes on: the route context's,
// else the URL's escaped path.
func allowed(mux *chi.Mux, req *http.Request) []string {
	path := req.URL.RawPath
	if path == "" {
		path = req.URL.Path
	}
	if rctx := chi.RouteContext(req.Context()); rctx != nil && rctx.RoutePath != "" {
		path = rctx.RoutePath
	}
	var out []string
	for _, m := range methods {
		match := mux.Match(chi.NewRouteContext(), m, path)
		if m == http.MethodHead {
			match = match || mux.Match(chi.NewRouteContext(), http.MethodGet, path)
		}
		if match {
			out = append(out, m)
		}
	}
	return out
}

// writeJSON answers v as JSON with status.
func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		writeErr(w, http.StatusInternalServerError, "Internal error")
		return
	}
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// writeErr answers Core's error format {"err": msg}.
func writeErr(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]string{"err": msg})
}

// auth enforces CORESIM_APIKEY when set: the apikey header must hold it or a live
// session_id; otherwise 403 {"err":"Access denied"}.
func (a *api) auth(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if key := a.s.cfg.APIKey; key != "" {
			got := r.Header.Get("apikey")
			a.s.mu.Lock()
			ok := got != "" && (got == key || a.s.sessions[got])
			a.s.mu.Unlock()
			if !ok {
				writeErr(w, http.StatusForbidden, "Access denied")
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

func (a *api) login(w http.ResponseWriter, r *http.Request) {
	var cred struct {
		User     string `json:"user"`
		Password string `json:"password"`
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, 64<<10)).Decode(&cred); err != nil ||
		cred.User != a.s.cfg.User || cred.Password != a.s.cfg.Password {
		writeErr(w, http.StatusForbidden, "Failed to login")
		return
	}
	id := newID()
	a.s.mu.Lock()
	a.s.sessions[id] = true
	a.s.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]string{"session_id": id})
}

func (a *api) logout(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("apikey")
	a.s.mu.Lock()
	ok := a.s.sessions[key]
	delete(a.s.sessions, key)
	a.s.mu.Unlock()
	if !ok && key != a.s.cfg.APIKey {
		writeErr(w, http.StatusBadRequest, "Logout error")
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"response": "Logout success"})
}

// submit is POST /file: Content-Length required (411), a valid callbackurl (400), room
// in the scan queue (503), a non-empty body (422). The body is inspected while read.
func (a *api) submit(w http.ResponseWriter, r *http.Request) {
	s := a.s
	// Without Content-Length: chunked (-1), or no framing at all, which net/http reads
	// as an empty body (0) with no Content-Length header.
	if r.ContentLength < 0 || (r.ContentLength == 0 && r.Header.Get("Content-Length") == "") {
		writeErr(w, http.StatusLengthRequired, "Missing Content-Length header.")
		return
	}
	cb := r.Header.Get("callbackurl")
	if cb != "" && !validCallbackURL(cb) {
		writeErr(w, http.StatusBadRequest, "Callback url is invalid.")
		return
	}
	if s.model.QueueLen() >= s.cfg.QueueSize {
		s.m.submissions.WithLabelValues("busy").Inc()
		writeErr(w, http.StatusServiceUnavailable, "Server is too busy. Try again later.")
		return
	}
	var b *batch
	if id := r.Header.Get("batch"); id != "" {
		s.mu.Lock()
		b = s.batches[id]
		closed := b != nil && b.closed
		s.mu.Unlock()
		if b == nil || closed {
			writeErr(w, http.StatusBadRequest, "Invalid batch id or batch closed.")
			return
		}
	}
	if r.ContentLength == 0 {
		writeErr(w, http.StatusUnprocessableEntity, "File is empty.")
		return
	}
	name := r.Header.Get("filename")
	if name == "" {
		name = "file"
	}
	in, size, err := inspect(r.Body, name, s.cfg.TempDir)
	if err != nil {
		writeErr(w, http.StatusBadRequest, "Failed to read the file.")
		return
	}
	if size == 0 {
		writeErr(w, http.StatusUnprocessableEntity, "File is empty.")
		return
	}
	rule := r.Header.Get("rule")
	if rule == "" {
		rule = r.Header.Get("workflow")
	}
	if rule == "" {
		rule = "File process"
	}
	sc := &scan{
		id:          newID(),
		in:          in,
		name:        name,
		userAgent:   r.Header.Get("user_agent"),
		rule:        rule,
		callbackURL: cb,
		metadata:    r.Header.Get("metadata"),
		uploaded:    s.model.Now(),
	}
	s.mu.Lock()
	// Check the queue again and enqueue under s.mu (lock order s.mu, then the model's):
	// concurrent submissions all passed the first check while their uploads were read.
	// The job is set before the scan is visible to hash look-ups and batch status,
	// which read sc.job.
	if s.model.QueueLen() >= s.cfg.QueueSize {
		s.mu.Unlock()
		s.m.submissions.WithLabelValues("busy").Inc()
		writeErr(w, http.StatusServiceUnavailable, "Server is too busy. Try again later.")
		return
	}
	sc.job = s.model.Enqueue(s.scanCost(in), sc)
	s.scans[sc.id] = sc
	for _, h := range []string{in.File.MD5, in.File.SHA1, in.File.SHA256} {
		s.byHash[h] = sc
	}
	if b != nil {
		sc.batch = b.id
		b.files = append(b.files, sc)
	}
	s.mu.Unlock()
	s.m.submissions.WithLabelValues("accepted").Inc()
	writeJSON(w, http.StatusOK, map[string]string{"data_id": sc.id})
}

// fetchGate holds a fetch for RequestLatency (virtual), then has an API worker receive
// it (RejectCost of core time) and apply Core's own rate limit: a fetch over the limit
// waits its turn, FetchWait at most, without a worker, or is answered 503 at once when
// its turn is further away. It reports whether the request may go on.
func (a *api) fetchGate(w http.ResponseWriter, r *http.Request, kind string) bool {
	s := a.s
	// The network's share varies from request to request (uniform, ±50%): requests
	// sent together do not all reach Core at the same instant.
	latency := time.Duration(float64(s.cfg.RequestLatency) * (0.5 + rand.Float64()))
	select {
	case <-s.model.After(latency):
	case <-r.Context().Done():
		return false
	}
	// A web server worker receives the request and checks Core's limit at the virtual
	// instant it does so: requests reach the limiter one after another, as they do in
	// Core, however many arrived in the same step of the model.
	served := workPoll // what the fetch's core time counts as when allowed
	if kind == "batch_status" {
		served = workBatchStatus
	}
	allowed := false
	var turn time.Duration // virtual instant at which an allowed fetch may go on
	admitted := s.model.Admit(coreSeconds(s.cfg.RejectCost), func(at time.Duration) work {
		delay, ok := s.fetch.ReserveAt(s.epoch.Add(at))
		if !ok {
			return workReject
		}
		allowed, turn = true, at+delay
		return served
	})
	select {
	case <-admitted:
	case <-r.Context().Done():
		return false
	}
	if !allowed {
		s.m.fetches.WithLabelValues(kind, "rejected").Inc()
		writeErr(w, http.StatusServiceUnavailable, "Too many requests. Try again later.")
		return false
	}
	if wait := turn - s.model.Now(); wait > 0 {
		select {
		case <-s.model.After(wait):
		case <-r.Context().Done():
			return false
		}
	}
	return true
}

// result is GET /file/{data_id}: the analysis result, in progress or complete. An
// unknown data_id answers 404 {"err":"Not found"}: older OPSWAT guides document 404,
// the 4.18 spec lists only 200 and 500; 404 lets clients stop polling a lost id.
func (a *api) result(w http.ResponseWriter, r *http.Request) {
	s := a.s
	if !a.fetchGate(w, r, "result") {
		return
	}
	sc := s.lookup(chi.URLParam(r, "data_id"))
	if sc == nil {
		s.m.fetches.WithLabelValues("result", "not_found").Inc()
		if s.wait(r.Context(), workPoll, s.cfg.PollCostBase) {
			writeErr(w, http.StatusNotFound, "Not found")
		}
		return
	}
	res, entries := s.resultOf(sc)
	cost := s.cfg.PollCostBase + time.Duration(entries)*s.cfg.PollCostEntry
	if !s.wait(r.Context(), workPoll, cost) {
		return
	}
	s.m.fetches.WithLabelValues("result", "served").Inc()
	writeJSON(w, http.StatusOK, res)
}

func (s *Sim) lookup(id string) *scan {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.scans[id]
}

// hashLookup is GET /hash/{hash}: the last result for an md5, sha1 or sha256; a miss
// answers 200 {"<hash>":"Not Found"} as Core does.
func (a *api) hashLookup(w http.ResponseWriter, r *http.Request) {
	s := a.s
	h := strings.ToLower(chi.URLParam(r, "hash"))
	s.mu.Lock()
	sc := s.byHash[h]
	s.mu.Unlock()
	if sc == nil {
		if s.wait(r.Context(), workPoll, s.cfg.PollCostBase) {
			writeJSON(w, http.StatusOK, map[string]string{chi.URLParam(r, "hash"): "Not Found"})
		}
		return
	}
	res, entries := s.resultOf(sc)
	if s.wait(r.Context(), workPoll, s.cfg.PollCostBase+time.Duration(entries)*s.cfg.PollCostEntry) {
		writeJSON(w, http.StatusOK, res)
	}
}

func (a *api) cancel(w http.ResponseWriter, r *http.Request) {
	s := a.s
	id := chi.URLParam(r, "data_id")
	sc := s.lookup(id)
	if sc == nil {
		writeErr(w, http.StatusNotFound, "Not found")
		return
	}
	if !s.model.Cancel(sc.job) {
		writeErr(w, http.StatusBadRequest, "The scan already finished.")
		return
	}
	s.mu.Lock()
	sc.canceled = true
	sc.complete = true
	sc.finished = s.model.Now()
	s.done = append(s.done, sc)
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]string{id: "cancelled"})
}

// converted is GET /file/converted/{data_id}. The emulator keeps no upload, so the
// "sanitized" file is a deterministic stand-in of the original's size, streamed.
func (a *api) converted(w http.ResponseWriter, r *http.Request) {
	s := a.s
	sc := s.lookup(chi.URLParam(r, "data_id"))
	if sc == nil {
		writeErr(w, http.StatusNotFound, "Not found")
		return
	}
	s.mu.Lock()
	complete := sc.complete && !sc.canceled
	s.mu.Unlock()
	if !complete {
		writeErr(w, http.StatusNotFound, "Not found")
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Disposition", `attachment; filename="`+strings.ReplaceAll(sc.name, `"`, "")+`"`)
	w.Header().Set("Content-Length", strconv.FormatInt(sc.in.File.Size, 10))
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodHead {
		return
	}
	seed := [32]byte{}
	copy(seed[:], sc.id)
	_, _ = io.CopyN(w, rand.NewChaCha8(seed), sc.in.File.Size)
}

func (a *api) rules(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, []map[string]any{
		{"name": "File process", "max_file_size": 0, "allow_cert": false, "allow_local_files": false},
	})
}

func (a *api) version(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"product_id": "MDCORE", "version": "5.13.0"})
}

// readyz is Core 5.x's readiness: 200 while the scan queue holds at most ReadyOccupancy
// of QueueSize.
func (a *api) readyz(w http.ResponseWriter, _ *http.Request) {
	if n := a.s.model.QueueLen(); float64(n) > a.s.cfg.ReadyOccupancy*float64(a.s.cfg.QueueSize) {
		writeErr(w, http.StatusServiceUnavailable, "Scan queue is over its threshold.")
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
}

// statNodes answers GET /stat/nodes: the node's scan_queue and load as OPSWAT's
// description gives them, and scan_queue_details as newer Core adds it (docs/core-api.md):
// total_scan_queue the files in the queue, available_slots the files it takes before
// POST /file answers 503. The call costs a poll's base core time, as any GET does.
func (a *api) statNodes(w http.ResponseWriter, r *http.Request) {
	s := a.s
	if !s.wait(r.Context(), workPoll, s.cfg.PollCostBase) {
		return
	}
	_, busy, _ := s.model.Load()
	queued := s.model.QueueLen()
	writeJSON(w, http.StatusOK, []map[string]any{{
		"external_nodes_allowed": false,
		"max_node_count":         1,
		"statuses": []map[string]any{{
			"id": "coresim", "address": "127.0.0.1", "cpu_cores": s.cfg.Cores,
			"engines": s.engineList(), "free_disk_space": 1 << 40, "issues": []any{},
			"load": int(100 * busy / float64(s.cfg.Cores)), "os": "coresim",
			"scan_queue": queued, "total_memory": 24 << 30, "version": "5.13.0",
			"scan_queue_details": map[string]int{"total_scan_queue": queued, "available_slots": max(s.cfg.QueueSize-queued, 0)},
		}},
	}})
}

func (a *api) statEngines(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, a.s.engineList())
}

// engineList describes the file type engine, the archive engine and the AV engines.
func (s *Sim) engineList() []map[string]any {
	def := s.timestamp(0)
	out := []map[string]any{
		{"eng_id": "filetype", "eng_name": "File type analysis", "engine_type": "filetype", "active": true, "state": "production", "def_time": def, "eng_ver": "1.0"},
		{"eng_id": "archive", "eng_name": "Archive", "engine_type": "archive", "active": true, "state": "production", "def_time": def, "eng_ver": "1.0"},
	}
	for _, e := range s.cfg.Engines {
		out = append(out, map[string]any{"eng_id": engineID(e), "eng_name": e, "engine_type": "av", "active": true, "state": "production", "def_time": def, "eng_ver": "1.0"})
	}
	return out
}

func engineID(name string) string {
	return strings.ToLower(strings.NewReplacer(" ", "", ".", "").Replace(name)) + "_1_windows"
}
