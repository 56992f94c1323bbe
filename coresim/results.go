package coresim

import (
	"fmt"
	"math"
)

// Result codes of scan_all_result_i and their scan_all_result_a text
// (docs/core-api.md; ProcessingResultsIndexEnum of the spec).
const (
	resultClean      = 0
	resultInfected   = 1
	resultFailed     = 3
	resultCanceled   = 19
	resultInProgress = 255
)

var resultText = map[int]string{
	resultClean:      "No Threat Detected",
	resultInfected:   "Infected",
	resultFailed:     "Failed",
	resultCanceled:   "Canceled",
	resultInProgress: "In Progress",
}

// engineReport is one engine's entry of scan_details.
type engineReport struct {
	ScanResultI int    `json:"scan_result_i"`
	ThreatFound string `json:"threat_found"`
	DefTime     string `json:"def_time"`
	ScanTime    int64  `json:"scan_time"`
	WaitTime    int64  `json:"wait_time"`
}

type fileInfo struct {
	DisplayName         string `json:"display_name"`
	FileSize            int64  `json:"file_size"`
	FileType            string `json:"file_type"`
	FileTypeDescription string `json:"file_type_description"`
	MD5                 string `json:"md5"`
	SHA1                string `json:"sha1"`
	SHA256              string `json:"sha256"`
	UploadTimestamp     string `json:"upload_timestamp"`
}

type scanResults struct {
	DataID          string                  `json:"data_id"`
	ScanAllResultI  int                     `json:"scan_all_result_i"`
	ScanAllResultA  string                  `json:"scan_all_result_a"`
	ProgressPercent int                     `json:"progress_percentage"`
	TotalAVs        int                     `json:"total_avs"`
	TotalTime       int64                   `json:"total_time"`
	StartTime       string                  `json:"start_time"`
	InQueue         *int                    `json:"in_queue,omitempty"`
	ScanDetails     map[string]engineReport `json:"scan_details"`
}

type postProcessing struct {
	ActionsFailed        string `json:"actions_failed"`
	ActionsRan           string `json:"actions_ran"`
	ConvertedDestination string `json:"converted_destination"`
	ConvertedTo          string `json:"converted_to"`
	CopyMoveDestination  string `json:"copy_move_destination"`
}

type processInfo struct {
	ProgressPercent int            `json:"progress_percentage"`
	Result          string         `json:"result"`
	BlockedReason   string         `json:"blocked_reason"`
	Profile         string         `json:"profile"`
	QueueTime       int64          `json:"queue_time"`
	ProcessingTime  int64          `json:"processing_time"`
	UserAgent       string         `json:"user_agent"`
	Username        string         `json:"username"`
	Verdicts        []string       `json:"verdicts"`
	PostProcessing  postProcessing `json:"post_processing"`
}

type extractedFile struct {
	DataID              string `json:"data_id"`
	DisplayName         string `json:"display_name"`
	FileSize            int64  `json:"file_size"`
	FileType            string `json:"file_type"`
	FileTypeDescription string `json:"file_type_description"`
	SHA256              string `json:"sha256"`
	ProgressPercent     int    `json:"progress_percentage"`
	ScanAllResultI      int    `json:"scan_all_result_i"`
	ScanAllResultA      string `json:"scan_all_result_a"`
	ScannedWith         int    `json:"scanned_with"`
	DetectedBy          int    `json:"detected_by"`
}

type extractedFiles struct {
	FilesExtractedCount int             `json:"files_extracted_count"`
	FirstIndex          int             `json:"first_index"`
	PageSize            int             `json:"page_size"`
	FilesInArchive      []extractedFile `json:"files_in_archive"`
}

// analysisResult is the JSON of GET /file/{data_id}, of a hash look-up and of a
// callback: the spec's AnalysisResult plus extracted_files for archives.
type analysisResult struct {
	DataID         string          `json:"data_id"`
	FileInfo       fileInfo        `json:"file_info"`
	ScanResults    scanResults     `json:"scan_results"`
	ProcessInfo    processInfo     `json:"process_info"`
	ExtractedFiles *extractedFiles `json:"extracted_files,omitempty"`
	Metadata       string          `json:"metadata,omitempty"`
}

// resultOf builds sc's result now, and returns it with its number of entries
// (objects reported × engines), the measure of what it costs Core to answer.
func (s *Sim) resultOf(sc *scan) (*analysisResult, int) {
	done, queued, ahead := s.model.Progress(sc.job)
	queueTime, procTime := s.model.Times(sc.job)
	s.mu.Lock()
	complete, canceled := sc.complete, sc.canceled
	s.mu.Unlock()

	in := sc.in
	progress := int(math.Floor(done * 100))
	if progress >= 100 && !complete {
		progress = 99
	}
	if complete {
		progress = 100
	}
	objects := in.Objects()
	scanned := objects
	if !complete {
		scanned = int(done * float64(objects))
	}
	engines := s.cfg.Engines

	overall := resultInProgress
	verdict := "Processing"
	blocked := ""
	verdicts := []string{} // the spec's verdicts is an array, never null
	switch {
	case canceled:
		overall, verdict = resultCanceled, "Blocked"
		blocked, verdicts = "Canceled", []string{"Canceled"}
	case !complete:
	case in.Corrupt:
		overall, verdict = resultFailed, "Blocked"
		blocked, verdicts = "Failed", []string{"Failed"}
	case in.Infected():
		overall, verdict = resultInfected, "Blocked"
		blocked, verdicts = "Infected", []string{"Infected"}
	default:
		overall, verdict, verdicts = resultClean, "Allowed", []string{"No Threat Detected"}
	}

	perObject := int64(0)
	if objects > 0 {
		perObject = procTime.Milliseconds() / int64(objects)
	}
	details := make(map[string]engineReport, len(engines))
	if scanned > 0 || complete {
		for _, e := range engines {
			rep := engineReport{DefTime: s.timestamp(0), ScanTime: perObject, WaitTime: 0}
			switch {
			case canceled:
				rep.ScanResultI = resultCanceled
			case complete && in.Corrupt:
				rep.ScanResultI = resultFailed
			case complete && in.Infected():
				rep.ScanResultI, rep.ThreatFound = resultInfected, "EICAR-Test-File (not a virus)"
			case complete:
				rep.ScanResultI = resultClean
			default:
				rep.ScanResultI = resultInProgress
			}
			details[e] = rep
		}
	}
	res := &analysisResult{
		DataID: sc.id,
		FileInfo: fileInfo{
			DisplayName: sc.name, FileSize: in.File.Size,
			FileType: in.File.Type, FileTypeDescription: in.File.TypeDesc,
			MD5: in.File.MD5, SHA1: in.File.SHA1, SHA256: in.File.SHA256,
			UploadTimestamp: s.timestamp(sc.uploaded),
		},
		ScanResults: scanResults{
			DataID: sc.id, ScanAllResultI: overall, ScanAllResultA: resultText[overall],
			ProgressPercent: progress, TotalAVs: len(engines),
			TotalTime: procTime.Milliseconds(), StartTime: s.timestamp(sc.uploaded + queueTime),
			ScanDetails: details,
		},
		ProcessInfo: processInfo{
			ProgressPercent: progress, Result: verdict, BlockedReason: blocked,
			Profile: sc.rule, QueueTime: queueTime.Milliseconds(),
			ProcessingTime: procTime.Milliseconds(), UserAgent: sc.userAgent,
			Username: "LOCAL/admin", Verdicts: verdicts,
		},
		Metadata: sc.metadata,
	}
	if queued {
		res.ScanResults.InQueue = &ahead
	}
	// Core extracts an archive's parts when it starts processing the file: a queued
	// file's result lists none (and stays small), then every part is listed, scanned or
	// not yet.
	if len(in.Parts) > 0 && !queued {
		ef := &extractedFiles{FilesExtractedCount: len(in.Parts), PageSize: len(in.Parts)}
		for i, p := range in.Parts {
			f := extractedFile{
				DataID: fmt.Sprintf("%s%04d", sc.id[:28], i+1), DisplayName: p.Name,
				FileSize: p.Size, FileType: p.Type, FileTypeDescription: p.TypeDesc,
				SHA256: p.SHA256, ScannedWith: len(engines),
			}
			switch {
			case canceled:
				f.ScanAllResultI = resultCanceled
			case i+1 < scanned || complete: // object 0 is the file itself
				f.ProgressPercent = 100
				if p.Infected {
					f.ScanAllResultI, f.DetectedBy = resultInfected, len(engines)
				}
			default:
				f.ScanAllResultI = resultInProgress
			}
			f.ScanAllResultA = resultText[f.ScanAllResultI]
			ef.FilesInArchive = append(ef.FilesInArchive, f)
		}
		res.ExtractedFiles = ef
	}
	return res, max(1, scanned) * len(engines)
}
