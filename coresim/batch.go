package coresim

import (
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/go-chi/chi/v5"
)

// batch is an open or closed batch of scans.
type batch struct {
	id, rule, userAgent, userData string
	created                       time.Duration
	closed                        bool
	files                         []*scan
}

// batchPageSize is how many files a batch status page lists, as Core does.
const batchPageSize = 50

// batchOpen is POST /file/batch: a new, open batch, whose id submissions name in
// their batch header.
func (a *api) batchOpen(w http.ResponseWriter, r *http.Request) {
	s := a.s
	b := &batch{
		id: newID(), rule: r.Header.Get("rule"), userAgent: r.Header.Get("user-agent"),
		userData: r.Header.Get("user-data"), created: s.model.Now(),
	}
	if b.rule == "" {
		b.rule = "File process"
	}
	s.mu.Lock()
	s.batches[b.id] = b
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]string{"batch_id": b.id})
}

// batchStatus is GET /file/batch/{batch_id}?first=N: a page of 50 files from index N.
// Core's own rate limit applies, and the answer costs core time per file listed.
func (a *api) batchStatus(w http.ResponseWriter, r *http.Request) {
	s := a.s
	if !a.fetchGate(w, r, "batch_status") {
		return
	}
	first := 0
	if v := r.URL.Query().Get("first"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			writeErr(w, http.StatusBadRequest, "Invalid parameter: first.")
			return
		}
		first = n
	}
	res, n, ok := s.batchResult(chi.URLParam(r, "batch_id"), first)
	if !ok {
		s.m.fetches.WithLabelValues("batch_status", "not_found").Inc()
		writeErr(w, http.StatusNotFound, "Not found")
		return
	}
	if s.wait(r.Context(), workBatchStatus, s.cfg.PollCostBase+time.Duration(n)*s.cfg.BatchCostFile) {
		s.m.fetches.WithLabelValues("batch_status", "served").Inc()
		writeJSON(w, http.StatusOK, res)
	}
}

// batchClose is POST /file/batch/{batch_id}/close: no submission joins the batch
// any more; the answer is its first status page.
func (a *api) batchClose(w http.ResponseWriter, r *http.Request) {
	s := a.s
	id := chi.URLParam(r, "batch_id")
	s.mu.Lock()
	b := s.batches[id]
	if b != nil {
		b.closed = true
	}
	s.mu.Unlock()
	res, _, ok := s.batchResult(id, 0)
	if b == nil || !ok {
		writeErr(w, http.StatusNotFound, "Not found")
		return
	}
	writeJSON(w, http.StatusOK, res)
}

// batchCertificate is GET /file/batch/{batch_id}/certificate: a plain YAML report of
// the batch (Core signs its own).
func (a *api) batchCertificate(w http.ResponseWriter, r *http.Request) {
	s := a.s
	res, _, ok := s.batchResult(chi.URLParam(r, "batch_id"), 0)
	if !ok {
		writeErr(w, http.StatusNotFound, "Not found")
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8") // YAML, as the spec's text/plain
	fmt.Fprintf(w, "batch_id: %s\nis_closed: %t\nresult: %s\nfiles: %d\n",
		res.BatchID, res.IsClosed, res.ProcessInfo.Result, res.BatchFiles.BatchCount)
}

// batchFile is one file of a batch status page.
type batchFile struct {
	DataID              string `json:"data_id"`
	DisplayName         string `json:"display_name"`
	FileSize            int64  `json:"file_size"`
	FileType            string `json:"file_type"`
	FileTypeDescription string `json:"file_type_description"`
	ProgressPercent     int    `json:"progress_percentage"`
	ScanAllResultI      int    `json:"scan_all_result_i"`
	ScanAllResultA      string `json:"scan_all_result_a"`
	ScannedWith         int    `json:"scanned_with"`
	DetectedBy          int    `json:"detected_by"`
	ProcessInfo         struct {
		BlockedReason   string   `json:"blocked_reason"`
		ProgressPercent int      `json:"progress_percentage"`
		Result          string   `json:"result"`
		Verdicts        []string `json:"verdicts"`
	} `json:"process_info"`
}

// batchResponse is the JSON of a batch status (the spec's BatchResponse).
type batchResponse struct {
	BatchID    string `json:"batch_id"`
	IsClosed   bool   `json:"is_closed"`
	UserData   string `json:"user_data,omitempty"`
	BatchFiles struct {
		BatchCount   int         `json:"batch_count"`
		FirstIndex   int         `json:"first_index"`
		PageSize     int         `json:"page_size"`
		FilesInBatch []batchFile `json:"files_in_batch"`
	} `json:"batch_files"`
	ProcessInfo struct {
		BlockedReason string `json:"blocked_reason"`
		Profile       string `json:"profile"`
		Result        string `json:"result"`
		UserAgent     string `json:"user_agent"`
		Username      string `json:"username"`
	} `json:"process_info"`
	ScanResults struct {
		BatchID        string `json:"batch_id"`
		ScanAllResultI int    `json:"scan_all_result_i"`
		ScanAllResultA string `json:"scan_all_result_a"`
		StartTime      string `json:"start_time"`
		TotalAVs       int    `json:"total_avs"`
		TotalTime      int64  `json:"total_time"`
	} `json:"scan_results"`
}

// batchResult builds the status page of batch id from index first; n is the number of
// files on the page.
func (s *Sim) batchResult(id string, first int) (res *batchResponse, n int, ok bool) {
	s.mu.Lock()
	b := s.batches[id]
	var files []*scan
	var closed bool
	if b != nil {
		files = append(files, b.files...)
		closed = b.closed
	}
	s.mu.Unlock()
	if b == nil {
		return nil, 0, false
	}
	res = &batchResponse{BatchID: b.id, IsClosed: closed, UserData: b.userData}
	res.BatchFiles.BatchCount = len(files)
	res.BatchFiles.FirstIndex = first
	res.BatchFiles.PageSize = batchPageSize
	res.BatchFiles.FilesInBatch = []batchFile{}
	overall, allDone := resultClean, true
	// Each file's result is built once: for the batch's overall verdict and the page.
	results := make([]*analysisResult, len(files))
	for k, sc := range files {
		r, _ := s.resultOf(sc)
		results[k] = r
		i := r.ScanResults.ScanAllResultI
		if i == resultInProgress {
			allDone = false
		} else if i != resultClean && overall == resultClean {
			overall = i
		}
	}
	for i := first; i < len(files) && i < first+batchPageSize; i++ {
		r := results[i]
		f := batchFile{
			DataID: r.DataID, DisplayName: r.FileInfo.DisplayName, FileSize: r.FileInfo.FileSize,
			FileType: r.FileInfo.FileType, FileTypeDescription: r.FileInfo.FileTypeDescription,
			ProgressPercent: r.ScanResults.ProgressPercent, ScanAllResultI: r.ScanResults.ScanAllResultI,
			ScanAllResultA: r.ScanResults.ScanAllResultA, ScannedWith: r.ScanResults.TotalAVs,
		}
		if f.ScanAllResultI == resultInfected {
			f.DetectedBy = r.ScanResults.TotalAVs
		}
		f.ProcessInfo.BlockedReason = r.ProcessInfo.BlockedReason
		f.ProcessInfo.ProgressPercent = r.ProcessInfo.ProgressPercent
		f.ProcessInfo.Result = r.ProcessInfo.Result
		f.ProcessInfo.Verdicts = r.ProcessInfo.Verdicts
		res.BatchFiles.FilesInBatch = append(res.BatchFiles.FilesInBatch, f)
		n++
	}
	if !allDone || !closed {
		overall = resultInProgress
	}
	res.ProcessInfo.Profile = b.rule
	res.ProcessInfo.UserAgent = b.userAgent
	res.ProcessInfo.Username = "LOCAL/admin"
	switch overall {
	case resultInProgress:
		res.ProcessInfo.Result = "Processing"
	case resultClean:
		res.ProcessInfo.Result = "Allowed"
	default:
		res.ProcessInfo.Result = "Blocked"
		res.ProcessInfo.BlockedReason = resultText[overall]
	}
	res.ScanResults.BatchID = b.id
	res.ScanResults.ScanAllResultI = overall
	res.ScanResults.ScanAllResultA = resultText[overall]
	res.ScanResults.StartTime = s.timestamp(b.created)
	res.ScanResults.TotalAVs = len(s.cfg.Engines)
	res.ScanResults.TotalTime = (s.model.Now() - b.created).Milliseconds()
	return res, n, true
}
