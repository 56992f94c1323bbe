package proxy

import (
	"encoding/json"
	"net/http"
	"strconv"
)

// writeError answers status with a body in Core's error format, {"err": msg}
// (shared/core-api/README.md, "Errors").
func writeError(w http.ResponseWriter, status int, msg string) {
	body, _ := json.Marshal(struct {
		Err string `json:"err"`
	}{msg})
	h := w.Header()
	h.Set("Content-Type", "application/json; charset=utf-8")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}
