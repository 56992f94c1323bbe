package main

import (
	"bytes"
	"fmt"
	"strings"

	"github.com/mdproxy/mdproxy/sidecar"
)

// configurationPage renders docs/configuration.md: every variable by group, with its
// unit, default, accepted values, whether a reload changes it and its meaning; then
// each route's default limit.
func configurationPage() ([]byte, error) {
	var b bytes.Buffer
	fmt.Fprintf(&b, "# Configuration\n\n<!-- %s -->\n\n", generated)
	b.WriteString(configIntro)
	group := ""
	for _, s := range sidecar.Settings() {
		if s.Group != group {
			group = s.Group
			fmt.Fprintf(&b, "\n## %s\n\n", group)
			b.WriteString("| variable | unit | default | accepts | reload | meaning |\n|---|---|---|---|---|---|\n")
		}
		reload := "restart"
		if s.Reload {
			reload = "yes, from `MDPROXY_LIMITS_FILE`"
		}
		def := "none"
		switch {
		case s.Default != "" && s.DefaultText != "":
			def = "`" + s.Default + "` (" + s.DefaultText + ")"
		case s.Default != "":
			def = "`" + s.Default + "`"
		case s.DefaultText != "":
			def = s.DefaultText
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s | %s | %s |\n", s.Name, s.Unit, cell(def), cell(s.Accepts), reload, cell(s.Meaning))
	}
	b.WriteString("\n### Each route's default limit\n\n")
	b.WriteString("`<ROUTE>` is a route name in upper case (`MDPROXY_FILE_RESULT_RATE=20`, `MDPROXY_OTHER_RATE=100`). ")
	b.WriteString("A route's limit, when none of its variables is set:\n\n| route |")
	for _, st := range sidecar.LimitSettings() {
		fmt.Fprintf(&b, " `_%s` |", st)
	}
	b.WriteString("\n|---|" + strings.Repeat("---|", len(sidecar.LimitSettings())) + "\n")
	for _, d := range sidecar.RouteLimitDefaults() {
		fmt.Fprintf(&b, "| `%s` |", d.Route)
		for _, v := range d.Values {
			if v == "" {
				b.WriteString(" none |")
				continue
			}
			fmt.Fprintf(&b, " `%s` |", v)
		}
		b.WriteString("\n")
	}
	b.WriteString(routesOutro)
	return b.Bytes(), nil
}

// cell escapes text for a Markdown table cell.
func cell(s string) string { return strings.ReplaceAll(s, "|", "\\|") }

const configIntro = `Every setting is an environment variable; mdproxy takes no other arguments than
` + "`--version` and `-h`/`--help`" + ` (which lists these variables with their unit and default; an
argument that asks for nothing, such as ` + "`--help=false`" + `, exits 2). The values are read at
start; only the route limits change without a restart, from ` + "`MDPROXY_LIMITS_FILE`" + ` (the
reload column).

- **Unset or empty** takes the default, except the addresses (` + "`MDPROXY_LISTEN_ADDR`" + `,
  ` + "`MDPROXY_ADMIN_ADDR`, `MDPROXY_UPSTREAM_URL`, `MDPROXY_BRIDGE_LISTEN_ADDR`" + `), which must
  not be set empty; an empty ` + "`MDPROXY_BRIDGE_CALLBACK_URL`" + ` is derived from the listener.
- **A bad value stops start-up** with exit code 2 and one ` + "`mdproxy failed`" + ` line whose ` + "`err`" + `
  names the variable and what it accepts (the accepts column), every bad variable at
  once, e.g. ` + "`MDPROXY_FILE_RESULT_RATE=\"fast\": want a number of requests per second >= 0: ...`" + `.
  A failure after the settings were read, such as a port in use, exits 1.
- **An unknown ` + "`MDPROXY_`" + ` variable** (any case: ` + "`mdproxy_file_result_rate`" + ` too) is
  named in one warning at start, ` + "`unknown variable ignored`" + `, with the nearest variable
  mdproxy reads (` + "`hint=\"did you mean MDPROXY_FILE_RESULT_RATE?\"`" + `), listed in ` + "`/config`" + `'s
  ` + "`unknown_variables`" + `, and otherwise ignored. It does not stop start-up: a variable set
  for another version of mdproxy, or by a platform, must not take a proxy down at a
  restart, and the warning and ` + "`/config`" + ` show it. The variables Kubernetes sets for a
  Service named mdproxy (` + "`MDPROXY_PORT`, `MDPROXY_PORT_8009_TCP...`, `MDPROXY_SERVICE_HOST`,\n  `MDPROXY_SERVICE_PORT...`" + `) are not reported.
- **A setting without effect** (a route's ` + "`_BURST` or `_MAX_WAIT`" + ` without a rate, its
  ` + "`_CLIENT_WINDOW` without a `_CLIENT_LIMIT`, `MDPROXY_CLIENT_KEYS_MAX`" + ` when no route has a
  ` + "`_CLIENT_LIMIT`" + `) is named in one warning at start and after each reload.
- **Durations** take a unit (` + "`500ms`, `2s`, `1m`" + `); timeouts and delays are at most ` + "`24h`" + `,
  the TTLs at most ` + "`8760h`" + `. **true/false** settings take what Go's ` + "`strconv.ParseBool`" + ` reads
  (` + "`1`, `t`, `TRUE`, `0`, `f`, `FALSE`" + `...). A URL's host is an IP address (an IPv6 one in
  brackets) or a DNS name whose last label is not all digits, so that an unexpanded
  ` + "`$(POD_IP)`" + ` stops start-up.
- **Logs** go to stderr, in ` + "`MDPROXY_LOG_FORMAT`" + `: text on a terminal, JSON otherwise. The
  start-up settings come as one ` + "`settings`" + ` line a group below, then one ` + "`route limits`" + ` line
  with each limited route; ` + "`/config`" + ` on the admin port answers the same as JSON.
- **Ctrl-C** (SIGINT), like SIGTERM, starts a graceful shutdown: ` + "`/readyz`" + ` answers 503 for
  ` + "`MDPROXY_SHUTDOWN_DELAY`" + ` (5 s) while the proxy keeps serving, then requests in flight
  have ` + "`MDPROXY_SHUTDOWN_TIMEOUT`" + ` (30 s); a second Ctrl-C skips the rest of the delay.
- Go's runtime variables apply too: ` + "`GOMEMLIMIT`" + ` caps the heap, and ` + "`GOGC`" + ` is 200 in mdproxy
  when unset (Go's default is 100).

` + "[`deploy/mdproxy.env`](../deploy/mdproxy.env)" + ` lists every variable commented at its default.
`

const routesOutro = `
Setting only a route's rate keeps its default burst. A route limit variable set in the
limits file takes precedence over the environment's; set empty there, it takes its
default. The routes are named in the table above.
`
