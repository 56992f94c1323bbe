package bench

import (
	"archive/zip"
	"crypto/sha256"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
)

func TestSizesFollowSpec(t *testing.T) {
	for _, spec := range []DataSpec{SeedData, QuickData, smallSpec} {
		sizes := spec.Sizes()
		if len(sizes) != spec.Files {
			t.Fatalf("len(Sizes()) = %d, want %d", len(sizes), spec.Files)
		}
		var sum int64
		for _, s := range sizes {
			sum += s
		}
		if mn, mx := slices.Min(sizes), slices.Max(sizes); mn != spec.MinBytes || mx != spec.MaxBytes {
			t.Errorf("%+v: sizes span [%d, %d], want [%d, %d]", spec, mn, mx, spec.MinBytes, spec.MaxBytes)
		}
		mean := float64(sum) / float64(len(sizes))
		if d := mean - float64(spec.MeanSize); d < -1 || d > 1 {
			t.Errorf("%+v: mean size %.1f, want %d within a byte", spec, mean, spec.MeanSize)
		}
		if !slices.Equal(sizes, spec.Sizes()) {
			t.Errorf("%+v: Sizes() differs between calls, want deterministic", spec)
		}
		parts := spec.partCounts(sizes)
		total := 0
		for _, p := range parts {
			total += p
		}
		if objs := 1 + float64(total)/float64(len(parts)); objs < float64(spec.MeanObjects)-1 || objs > float64(spec.MeanObjects)+1 {
			t.Errorf("%+v: %.1f objects per file, want %d within 1", spec, objs, spec.MeanObjects)
		}
	}
	// The published data set: 800 files, 762 MB.
	var sum int64
	for _, s := range SeedData.Sizes() {
		sum += s
	}
	if sum < 761_000_000 || sum > 763_000_000 {
		t.Errorf("seed data set totals %d bytes, want about 762 MB", sum)
	}
}

func TestLoadOrGenerate(t *testing.T) {
	dir := t.TempDir()
	files, err := LoadOrGenerate(dir, smallSpec)
	if err != nil {
		t.Fatalf("LoadOrGenerate() = %v", err)
	}
	sizes := smallSpec.Sizes()
	exts := map[string]bool{}
	for i, f := range files {
		if f.Size != sizes[i] {
			t.Errorf("%s: %d bytes, want exactly %d", f.Name, f.Size, sizes[i])
		}
		exts[filepath.Ext(f.Name)] = true
		zr, err := zip.OpenReader(f.Path)
		if err != nil {
			t.Fatalf("%s: not a zip: %v", f.Name, err)
		}
		names := map[string]bool{}
		for _, e := range zr.File {
			names[e.Name] = true
			rc, err := e.Open()
			if err != nil {
				t.Fatalf("%s: opening %s: %v", f.Name, e.Name, err)
			}
			if _, err := io.Copy(io.Discard, rc); err != nil {
				t.Errorf("%s: reading %s: %v", f.Name, e.Name, err)
			}
			rc.Close()
		}
		zr.Close()
		if len(names) != f.Parts {
			t.Errorf("%s: %d entries, want %d parts", f.Name, len(names), f.Parts)
		}
		main := officeTypes[i%len(officeTypes)].mainPart
		for _, want := range []string{"[Content_Types].xml", "_rels/.rels", "docProps/core.xml", "docProps/app.xml", main} {
			if !names[want] {
				t.Errorf("%s: no part %s, want an Office Open XML package", f.Name, want)
			}
		}
	}
	for _, ext := range []string{".docx", ".xlsx", ".pptx", ".xltx"} {
		if !exts[ext] {
			t.Errorf("no %s file in the data set", ext)
		}
	}

	// unzip -t accepts every file (CI installs unzip).
	if unzip, err := exec.LookPath("unzip"); err == nil {
		for _, f := range files {
			if out, err := exec.Command(unzip, "-tq", f.Path).CombinedOutput(); err != nil {
				t.Errorf("unzip -t %s: %v\n%s", f.Name, err, out)
			}
		}
	} else if os.Getenv("CI") != "" {
		t.Errorf("unzip not found: .ci/run must install it")
	}

	// Deterministic, and cached: a second call reads the manifest and rewrites nothing.
	sum := func(path string) [32]byte {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return sha256.Sum256(b)
	}
	first := sum(files[0].Path)
	st, _ := os.Stat(files[0].Path)
	again, err := LoadOrGenerate(dir, smallSpec)
	if err != nil {
		t.Fatalf("LoadOrGenerate() again = %v", err)
	}
	st2, _ := os.Stat(again[0].Path)
	if !st2.ModTime().Equal(st.ModTime()) {
		t.Errorf("second LoadOrGenerate rewrote %s, want it read from the cache", again[0].Name)
	}
	other, err := LoadOrGenerate(t.TempDir(), smallSpec)
	if err != nil {
		t.Fatalf("LoadOrGenerate() elsewhere = %v", err)
	}
	if sum(other[0].Path) != first {
		t.Errorf("the same spec generated different bytes, want deterministic files")
	}
	// A damaged cache is regenerated.
	if err := os.Truncate(files[1].Path, 10); err != nil {
		t.Fatal(err)
	}
	fixed, err := LoadOrGenerate(dir, smallSpec)
	if err != nil || fixed[1].Size != sizes[1] {
		t.Errorf("after truncating %s: LoadOrGenerate = size %d, %v, want it regenerated at %d", files[1].Name, fixed[1].Size, err, sizes[1])
	}
}

func TestLoadOrGenerateRejectsBadSpec(t *testing.T) {
	for _, spec := range []DataSpec{
		{},
		{Files: 1, MinBytes: 10, MaxBytes: 100, MeanSize: 50, MeanObjects: 20},
		{Files: 3, MinBytes: 20_000, MaxBytes: 10_000, MeanSize: 15_000, MeanObjects: 20},
		{Files: 3, MinBytes: 20_000, MaxBytes: 40_000, MeanSize: 50_000, MeanObjects: 20},
		{Files: 3, MinBytes: 20_000, MaxBytes: 40_000, MeanSize: 30_000, MeanObjects: 2},
	} {
		if _, err := LoadOrGenerate(t.TempDir(), spec); err == nil {
			t.Errorf("LoadOrGenerate(%+v) = nil error, want the spec refused", spec)
		}
	}
}
