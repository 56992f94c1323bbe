package bridge

import "encoding/json"

// inProgressResult is scan_all_result_i of a scan that is not over ("In Progress").
const inProgressResult = 255

// coreResult is the part of Core's analysis result (GET /file/{data_id}, or a callback's
// body) the bridge reads. A pointer is nil where the field is absent.
type coreResult struct {
	DataID      *string `json:"data_id"`
	ScanResults *struct {
		ProgressPercentage *float64 `json:"progress_percentage"`
		ScanAllResultI     *float64 `json:"scan_all_result_i"`
	} `json:"scan_results"`
	ProcessInfo *struct {
		ProgressPercentage *float64 `json:"progress_percentage"`
	} `json:"process_info"`
}

// parseResult decodes body as Core's analysis result. It fails on anything that is not a
// JSON object whose fields it reads have the types Core gives them.
func parseResult(body []byte) (coreResult, error) {
	var r coreResult
	err := json.Unmarshal(body, &r)
	return r, err
}

// final reports whether r's progress is complete: both progress percentages at 100 where
// present, at least one present, and scan_all_result_i (where present) not 255.
func (r coreResult) final() bool {
	present := false
	if r.ScanResults != nil {
		if p := r.ScanResults.ProgressPercentage; p != nil {
			if *p < 100 {
				return false
			}
			present = true
		}
		if i := r.ScanResults.ScanAllResultI; i != nil && *i == inProgressResult {
			return false
		}
	}
	if r.ProcessInfo != nil {
		if p := r.ProcessInfo.ProgressPercentage; p != nil {
			if *p < 100 {
				return false
			}
			present = true
		}
	}
	return present
}

// IsFinal reports whether body is a Core result whose progress is complete: both
// scan_results.progress_percentage and process_info.progress_percentage at 100 (where
// present; at least one present and none below 100). Core's documentation puts the field
// in scan_results, OPSWAT's integrations read it in process_info (docs/core-api.md,
// Results), hence either. A result that still says scan_all_result_i 255 ("In Progress")
// is not final whatever its percentages, and neither is a body that is not a JSON object
// or whose fields have other types than Core's.
func IsFinal(body []byte) bool {
	r, err := parseResult(body)
	return err == nil && r.final()
}

// InProgress renders the answer for a pending dataID before Core replied anything: a
// JSON object valid against OPSWAT's schema of GET /file/{data_id}, with data_id,
// scan_results.scan_all_result_i 255 and scan_all_result_a "In Progress",
// scan_results.progress_percentage 0, process_info.result "Processing" and
// process_info.progress_percentage 0. It holds nothing that could read as a verdict: no
// engine results, no blocked reason, no verdicts; a client that reads it as a result
// keeps polling. Each call returns a new slice.
func InProgress(dataID string) []byte {
	q, _ := json.Marshal(dataID) // a string always marshals
	b := make([]byte, 0, 160+len(q))
	b = append(b, `{"data_id":`...)
	b = append(b, q...)
	b = append(b, `,"scan_results":{"scan_all_result_i":255,"scan_all_result_a":"In Progress","progress_percentage":0},"process_info":{"result":"Processing","progress_percentage":0}}`...)
	return b
}
