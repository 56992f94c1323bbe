package sidecar

import (
	"log/slog"
	"regexp"
	"slices"
	"strings"

	"github.com/agnivade/levenshtein"

	"github.com/mdproxy/mdproxy/internal/envconf"
)

// kubernetesServiceVar matches the variables Kubernetes puts in every container of a
// namespace for a Service named mdproxy (the Docker links style: MDPROXY_PORT,
// MDPROXY_PORT_8009_TCP, _TCP_PROTO, _TCP_PORT, _TCP_ADDR, and the service style:
// MDPROXY_SERVICE_HOST, MDPROXY_SERVICE_PORT, MDPROXY_SERVICE_PORT_<PORT NAME>;
// Kubernetes' "Environment variables" of a Service). They are not settings and are
// never reported as unknown.
var kubernetesServiceVar = regexp.MustCompile(`^MDPROXY_(PORT(_[0-9]+_(TCP|UDP|SCTP)(_PROTO|_PORT|_ADDR)?)?|SERVICE_HOST|SERVICE_PORT(_[A-Z0-9_]+)?)$`)

// knownVariables returns every variable mdproxy reads: Config's and every route's
// limit variables.
func knownVariables() []string {
	return append(envconf.Names[Config](EnvPrefix), routeLimitVars()...)
}

// unknownVariables returns, sorted, the variables of environ that are spelt like
// mdproxy's (MDPROXY_ in any case) but that mdproxy does not read: most likely
// misspelt limits, which would otherwise leave a route at its default without a word.
// A lower-case spelling of a known variable is one of them (the environment is case
// sensitive); Kubernetes' variables of a Service named mdproxy are not
// (kubernetesServiceVar).
func unknownVariables(environ map[string]string) []string {
	known := knownVariables()
	var unknown []string
	for name := range environ {
		if !strings.HasPrefix(strings.ToUpper(name), EnvPrefix) || kubernetesServiceVar.MatchString(name) || slices.Contains(known, name) {
			continue
		}
		unknown = append(unknown, name)
	}
	slices.Sort(unknown)
	return unknown
}

// nearestVariable returns the variable mdproxy reads that name most likely meant: the
// known variable nearest to name in upper case by Levenshtein distance, when that is
// at most a quarter of its length after MDPROXY_ (at least 2); "" when none is that
// near.
func nearestVariable(name string) string {
	upper := strings.ToUpper(name)
	best, bestDist := "", max(2, (len(upper)-len(EnvPrefix))/4)+1
	for _, k := range knownVariables() {
		if d := levenshtein.ComputeDistance(upper, k); d < bestDist {
			best, bestDist = k, d
		}
	}
	return best
}

// warnUnknown logs each of unknown (unknownVariables' list) once, at WARN,
// with the nearest variable mdproxy reads when there is one ("did you mean
// MDPROXY_FILE_RESULT_RATE?"). An unknown variable is ignored: it does not stop
// start-up (see docs/configuration.md).
func warnUnknown(log *slog.Logger, unknown []string) {
	for _, name := range unknown {
		attrs := []any{"variable", name}
		if near := nearestVariable(name); near != "" {
			attrs = append(attrs, "hint", "did you mean "+near+"?")
		}
		log.Warn("unknown variable ignored", attrs...)
	}
}
