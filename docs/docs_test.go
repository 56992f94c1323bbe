// Package docs_test checks the repository's Markdown: every relative link of README.md,
// ARCHITECTURE.md, CHANGELOG.md and docs/*.md resolves to a file (and its #anchor to a
// heading of it), the README stays short with its set-up commands near the top, and
// ARCHITECTURE.md's layout table names every folder as the tree has it.
package docs_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// root is the repository's root, relative to this package.
const root = ".."

// pendingPages are pages linked before they are written: a link to one is accepted
// while it is missing; once it exists the test asks for its removal from this list, so
// that the exception cannot outlive the page's arrival. None today.
var pendingPages []string

// Limits on README.md (issue 31): at most 16 KB, and the set-up commands (the machine's
// packages, the tests, the demo) within its first 60 lines.
const (
	readmeMaxBytes = 16 * 1000
	setupMaxLine   = 60
)

var setupCommands = []string{
	"sudo apt-get install -y unzip prometheus redis-server nginx haproxy caddy wrk",
	"go test -race ./...",
	"go run ./cmd/mdbench --quick",
}

// markdownFiles returns the pages checked, relative to the root.
func markdownFiles(t *testing.T) []string {
	t.Helper()
	files := []string{"README.md", "ARCHITECTURE.md", "CHANGELOG.md"}
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range docs {
		rel, err := filepath.Rel(root, d)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, filepath.ToSlash(rel))
	}
	return files
}

func read(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(name)))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

var (
	linkRE       = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	codeSpanRE   = regexp.MustCompile("`[^`\n]*`")
	fenceRE      = regexp.MustCompile("^\\s*```")
	headingRE    = regexp.MustCompile(`^#{1,6}\s+(.+?)\s*#*\s*$`)
	notSlugChars = regexp.MustCompile(`[^\p{L}\p{N}\- _]`)
)

// prose returns the lines of a Markdown page that are not code: fenced blocks and
// indented code blocks (four spaces after a blank line) are blanked, and so are code
// spans unless keepSpans, so that a link-like text in a command is not taken for a link.
func prose(page string, keepSpans bool) []string {
	lines := strings.Split(page, "\n")
	out := make([]string, len(lines))
	fenced, indented := false, false
	for i, l := range lines {
		switch {
		case fenceRE.MatchString(l):
			fenced = !fenced
			continue
		case fenced:
			continue
		case strings.HasPrefix(l, "    ") && (indented || i == 0 || strings.TrimSpace(lines[i-1]) == ""):
			indented = true
			continue
		case strings.TrimSpace(l) == "":
			// A blank line inside an indented block keeps it open.
			continue
		}
		indented = false
		out[i] = l
		if !keepSpans {
			out[i] = codeSpanRE.ReplaceAllString(l, "")
		}
	}
	return out
}

// anchors returns the anchors GitHub gives a page's headings: lower case, punctuation
// (backticks included) but hyphens and underscores dropped, spaces as hyphens, a
// repeated one suffixed -1, -2.
func anchors(page string) map[string]bool {
	seen := map[string]int{}
	out := map[string]bool{}
	for _, l := range prose(page, true) {
		m := headingRE.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		slug := strings.Map(unicode.ToLower, m[1])
		slug = notSlugChars.ReplaceAllString(slug, "")
		slug = strings.ReplaceAll(slug, " ", "-")
		if n := seen[slug]; n > 0 {
			out[slug+"-"+strconv.Itoa(n)] = true
		} else {
			out[slug] = true
		}
		seen[slug]++
	}
	return out
}

// TestLinks: every relative link of the pages resolves to a file or folder of the
// repository, and an #anchor to a heading of the page it names.
func TestLinks(t *testing.T) {
	for _, p := range pendingPages {
		if _, err := os.Stat(filepath.Join(root, p)); err == nil {
			t.Errorf("%s exists now: remove it from pendingPages, so that links to it are checked", p)
		}
	}
	for _, name := range markdownFiles(t) {
		page := read(t, name)
		for i, l := range prose(page, false) {
			for _, m := range linkRE.FindAllStringSubmatch(l, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				file, anchor, _ := strings.Cut(target, "#")
				where := name + ":" + strconv.Itoa(i+1) + ": link " + target
				resolved := name
				if file != "" {
					resolved = filepath.ToSlash(filepath.Clean(filepath.Join(filepath.Dir(name), file)))
				}
				if strings.HasPrefix(resolved, "../") {
					t.Errorf("%s: leaves the repository", where)
					continue
				}
				if slices.Contains(pendingPages, resolved) {
					if _, err := os.Stat(filepath.Join(root, resolved)); err != nil {
						if anchor != "" {
							t.Errorf("%s: an anchor into a page of another branch cannot be checked", where)
						}
						continue
					}
				}
				info, err := os.Stat(filepath.Join(root, filepath.FromSlash(resolved)))
				if err != nil {
					t.Errorf("%s: %s does not exist", where, resolved)
					continue
				}
				if anchor == "" {
					continue
				}
				if info.IsDir() || !strings.HasSuffix(resolved, ".md") {
					t.Errorf("%s: an anchor into %s, which is no Markdown page", where, resolved)
					continue
				}
				if !anchors(read(t, resolved))[anchor] {
					t.Errorf("%s: %s has no heading #%s", where, resolved, anchor)
				}
			}
		}
	}
}

// TestReadmeShort: README.md is at most 16 KB, with the set-up commands in its first 60
// lines, each as a command of its own (an indented code line).
func TestReadmeShort(t *testing.T) {
	readme := read(t, "README.md")
	if n := len(readme); n > readmeMaxBytes {
		t.Errorf("README.md is %d bytes, want at most %d: move reference into docs/", n, readmeMaxBytes)
	}
	lines := strings.Split(readme, "\n")
	top := lines[:min(setupMaxLine, len(lines))]
	for _, c := range setupCommands {
		if !slices.Contains(top, "    "+c) {
			t.Errorf("README.md: no command line %q in its first %d lines", c, setupMaxLine)
		}
	}
}

// layoutPaths returns the paths of ARCHITECTURE.md's layout table, without their
// trailing slash.
func layoutPaths(t *testing.T) []string {
	t.Helper()
	_, section, ok := strings.Cut(read(t, "ARCHITECTURE.md"), "\n## Layout\n")
	if !ok {
		t.Fatal("ARCHITECTURE.md: no section Layout")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	row := regexp.MustCompile("^\\| `([^`]+)` \\|")
	var paths []string
	for l := range strings.SplitSeq(section, "\n") {
		if m := row.FindStringSubmatch(l); m != nil {
			paths = append(paths, strings.TrimSuffix(m[1], "/"))
		}
	}
	if len(paths) < 10 {
		t.Fatalf("ARCHITECTURE.md, Layout: %d rows, want one a folder", len(paths))
	}
	return paths
}

// TestArchitectureLayout: ARCHITECTURE.md's layout table has a row for every folder at
// the top of the repository and every folder that holds Go code (a package), every
// other folder lies under a row (its data: testdata, the vendored OpenAPI description,
// deploy's files), and every row names a folder that exists.
func TestArchitectureLayout(t *testing.T) {
	paths := layoutPaths(t)
	for _, p := range paths {
		if info, err := os.Stat(filepath.Join(root, filepath.FromSlash(p))); err != nil || !info.IsDir() {
			t.Errorf("ARCHITECTURE.md, Layout: row %s names no folder of the repository", p)
		}
	}
	covered := func(dir string) bool {
		for d := dir; d != "."; d = filepath.ToSlash(filepath.Dir(d)) {
			if slices.Contains(paths, d) {
				return true
			}
		}
		return false
	}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() || path == root {
			return nil
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if rel == ".git" || strings.HasPrefix(d.Name(), ".") && rel != ".ci" || rel == "bin" {
			return filepath.SkipDir
		}
		goFiles, err := filepath.Glob(filepath.Join(path, "*.go"))
		if err != nil {
			return err
		}
		top := !strings.Contains(rel, "/")
		switch {
		case (top || len(goFiles) > 0) && !slices.Contains(paths, rel):
			t.Errorf("ARCHITECTURE.md, Layout: no row for %s/ (a top folder or a package)", rel)
		case !covered(rel):
			t.Errorf("ARCHITECTURE.md, Layout: %s/ lies under no row", rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
