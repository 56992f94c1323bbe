// Command helm lints and renders mdproxy's Helm chart (deploy/helm/mdproxy) with Helm's
// own packages (helm.sh/helm/v4), without a cluster: CI's `helm lint` and
// `helm template`, and the renderer of deploy/'s tests. It is a module of its own, so
// that mdproxy's go.mod never requires Helm.
//
//	go run . lint [-f values.yaml]... [--set k=v]... CHART
//	go run . template [-f values.yaml]... [--set k=v]... [--name NAME] [--namespace NS] CHART
//
// lint runs every rule of `helm lint --strict` (pkg/chart/v2/lint): a warning fails as
// an error does. template renders as `helm template` does (the chart's values, then
// each -f file, then each --set, later ones winning), in Helm's install order, one
// "---" and "# Source:" line before each object, NOTES.txt left out. Exit status 1 on
// a lint finding or a render error, 2 on bad arguments.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/common/util"
	"helm.sh/helm/v4/pkg/chart/v2/lint"
	"helm.sh/helm/v4/pkg/chart/v2/lint/support"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/engine"
	releaseutil "helm.sh/helm/v4/pkg/release/v1/util"
	"helm.sh/helm/v4/pkg/strvals"
)

// stringList is a repeatable flag.
type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || (args[0] != "lint" && args[0] != "template") {
		fmt.Fprintln(stderr, "usage: helm lint|template [-f values.yaml]... [--set k=v]... [--name NAME] [--namespace NS] CHART")
		return 2
	}
	fs := flag.NewFlagSet(args[0], flag.ContinueOnError)
	fs.SetOutput(stderr)
	var files, sets stringList
	fs.Var(&files, "f", "a values file (repeatable; later ones win)")
	fs.Var(&sets, "set", "key=value on top of the files (repeatable), as helm's --set")
	name := fs.String("name", "mdproxy", "the release's name (template)")
	namespace := fs.String("namespace", "default", "the release's namespace")
	if err := fs.Parse(args[1:]); err != nil {
		return 2
	}
	if fs.NArg() != 1 {
		fmt.Fprintln(stderr, args[0]+": want one chart directory")
		return 2
	}
	chartDir := fs.Arg(0)
	vals, err := values(files, sets)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	if args[0] == "lint" {
		return lintChart(chartDir, vals, *namespace, stdout, stderr)
	}
	if err := render(chartDir, vals, *name, *namespace, stdout); err != nil {
		fmt.Fprintln(stderr, "template:", err)
		return 1
	}
	return 0
}

// values merges the files in order, then the --set expressions, as helm's -f and --set.
func values(files, sets []string) (map[string]any, error) {
	out := map[string]any{}
	for _, f := range files {
		v, err := common.ReadValuesFile(f)
		if err != nil {
			return nil, fmt.Errorf("-f %s: %w", f, err)
		}
		out = util.MergeTables(v, out)
	}
	for _, s := range sets {
		if err := strvals.ParseInto(s, out); err != nil {
			return nil, fmt.Errorf("--set %s: %w", s, err)
		}
	}
	return out, nil
}

// lintChart prints every finding of Helm's lint rules and returns 1 when one is a
// warning or worse (helm lint --strict).
func lintChart(chartDir string, vals map[string]any, namespace string, stdout, stderr io.Writer) int {
	l := lint.RunAll(chartDir, vals, namespace)
	failed := false
	for _, m := range l.Messages {
		fmt.Fprintln(stdout, m.Error())
		failed = failed || m.Severity >= support.WarningSev
	}
	if failed {
		fmt.Fprintf(stderr, "lint: %s: findings at warning or above\n", chartDir)
		return 1
	}
	fmt.Fprintf(stdout, "lint: %s: no warning\n", chartDir)
	return 0
}

// render writes the chart's manifests as helm template does, without a cluster.
func render(chartDir string, vals map[string]any, name, namespace string, w io.Writer) error {
	ch, err := loader.Load(chartDir)
	if err != nil {
		return err
	}
	caps := common.DefaultCapabilities.Copy()
	opts := common.ReleaseOptions{Name: name, Namespace: namespace, Revision: 1, IsInstall: true}
	top, err := util.ToRenderValues(ch, vals, opts, caps)
	if err != nil {
		return err
	}
	files, err := engine.Engine{}.RenderWithContext(context.Background(), ch, top)
	if err != nil {
		return err
	}
	for f := range files {
		if strings.HasSuffix(f, "NOTES.txt") {
			delete(files, f)
		}
	}
	hooks, manifests, err := releaseutil.SortManifests(files, nil, releaseutil.InstallOrder)
	if err != nil {
		return err
	}
	if len(hooks) > 0 {
		return fmt.Errorf("%d hooks: the chart has none, and this renderer does not write them", len(hooks))
	}
	for _, m := range manifests {
		fmt.Fprintf(w, "---\n# Source: %s\n%s\n", m.Name, m.Content)
	}
	return nil
}
