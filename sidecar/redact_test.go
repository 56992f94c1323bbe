package sidecar

import "testing"

// TestRedactedURL checks that no password of a URL given in a setting reaches a log, an
// error or /config, whether the URL parses or not, and that the rest stays readable.
func TestRedactedURL(t *testing.T) {
	for in, want := range map[string]string{
		"redis://:s3cret@127.0.0.1:6379/0":  "redis://:xxxxx@127.0.0.1:6379/0",
		"rediss://user:s3cret@redis:6380/1": "rediss://user:xxxxx@redis:6380/1",
		"redis://redis:6379/0":              "redis://redis:6379/0",
		"ftp://u:s3cret@core:8008":          "ftp://u:xxxxx@core:8008",
		"redis://:s3cret@redis:port/0":      "redis://:xxxxx@redis:port/0", // does not parse
		"redis://u:s3cret@h:x/0?a=b@c":      "redis://u:xxxxx@h:x/0?a=b@c", // does not parse
		"http://h:x/p@q":                    "http://h:x/p@q",              // no user info
		"not a URL":                         "not a URL",
	} {
		if got := redactedURL(in); got != want {
			t.Errorf("redactedURL(%q) = %q, want %q", in, got, want)
		}
	}
}
