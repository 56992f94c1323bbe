package main

import (
	"bytes"
	"fmt"
	"strings"

	"github.com/mdproxy/mdproxy/internal/cli"
	"github.com/mdproxy/mdproxy/sidecar"
)

// envFile renders deploy/mdproxy.env: every variable, commented out at its default
// (empty when it has none), with its unit and meaning; the route limits of each route
// that has a default limit, and the other routes by name.
func envFile() ([]byte, error) {
	var b bytes.Buffer
	fmt.Fprintf(&b, "# mdproxy's settings, every one commented out at its default.\n# %s\n", generated)
	b.WriteString(`#
# Uncomment and change what you need; docs/configuration.md says what each accepts.
# Load it into a shell with "set -a; . deploy/mdproxy.env; set +a", into a container
# with "docker run --env-file", into Kubernetes as a ConfigMap (envFrom). Values are
# literal: no quotes, no $VARIABLES.
`)
	group := ""
	for _, s := range sidecar.Settings() {
		if s.Group != group {
			group = s.Group
			fmt.Fprintf(&b, "\n# ==== %s ====\n", group)
		}
		if strings.Contains(s.Name, "<ROUTE>") {
			continue // the families, below
		}
		b.WriteString("\n")
		b.WriteString(cli.Fill(strings.ReplaceAll(s.Meaning, "`", ""), "# ", 88))
		fmt.Fprintf(&b, "# [%s; default %s]\n", s.Unit, s.DefaultWords())
		fmt.Fprintf(&b, "#%s=%s\n", s.Name, s.Default)
	}
	b.WriteString("\n# Each route's limit: MDPROXY_<ROUTE>_")
	b.WriteString(strings.Join(sidecar.LimitSettings(), ", _"))
	b.WriteString(".\n# Set in MDPROXY_LIMITS_FILE instead, they change without a restart.\n")
	var others []string
	for _, d := range sidecar.RouteLimitDefaults() {
		if d.Values[0] == "0" && d.Values[3] == "0" {
			others = append(others, d.Route)
			continue
		}
		fmt.Fprintf(&b, "\n# %s\n", d.Route)
		for i, st := range sidecar.LimitSettings() {
			fmt.Fprintf(&b, "#MDPROXY_%s_%s=%s\n", strings.ToUpper(d.Route), st, d.Values[i])
		}
	}
	b.WriteString("\n# No limit by default (e.g. MDPROXY_SUBMIT_RATE=0):\n")
	b.WriteString(cli.Fill(strings.Join(others, " "), "#   ", 88))
	return b.Bytes(), nil
}
