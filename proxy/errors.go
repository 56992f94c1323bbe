package proxy

import (
	"encoding/json"
	"net/http"
	"strconv"
)

// errorBody renders msg in Core's error format, {"err": msg}
// (docs/core-api.md, "Errors").
func errorBody(msg string) []byte {
	body, _ := json.Marshal(struct {
		Err string `json:"err"`
	}{msg})
	return body
}

// writeError answers status with msg in Core's error format.
func writeError(w http.ResponseWriter, status int, msg string) {
	writeBody(w, status, errorBody(msg))
}

// writeBody answers status with a JSON body rendered by errorBody.
func writeBody(w http.ResponseWriter, status int, body []byte) {
	h := w.Header()
	h["Content-Type"] = jsonContentType
	h["Content-Length"] = []string{strconv.Itoa(len(body))}
	h["X-Content-Type-Options"] = nosniff
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// Header values shared by every error answer; net/http never modifies them.
var (
	jsonContentType = []string{"application/json; charset=utf-8"}
	nosniff         = []string{"nosniff"}
)
