package bench

import (
	"archive/zip"
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"time"
)

// DataSpec describes a data set of Office Open XML files. The zero value is not valid;
// SeedData is the published benchmark's.
type DataSpec struct {
	Files    int   // number of distinct files
	MinBytes int64 // smallest file, bytes
	MaxBytes int64 // largest file, bytes
	MeanSize int64 // mean file size, bytes
	// MeanObjects is the mean number of objects Core scans per file: the file and its
	// parts. The published benchmark processed about 65 objects per submission
	// (292,389 files an hour for 2000 submissions in 26.9 min).
	MeanObjects int
	Seed        uint64 // the same seed gives the same files, byte for byte
}

// SeedData is the published benchmark's data set (bench/PUBLISHED.md): 800 files of
// 50 KB to 27 MB, 952 KB on average, 762 MB in all, DOCX, XLSX, PPTX and XLTX.
var SeedData = DataSpec{
	Files: 800, MinBytes: 50_000, MaxBytes: 27_000_000, MeanSize: 952_000,
	MeanObjects: 65, Seed: 1,
}

// DataFile is one generated file.
type DataFile struct {
	Name  string `json:"name"`  // file name, e.g. f0001.docx
	Path  string `json:"path"`  // absolute path on disk
	Size  int64  `json:"size"`  // bytes
	Parts int    `json:"parts"` // zip entries (files), each an object Core scans
}

// Office Open XML types of the data set, in the order files cycle through them.
var officeTypes = []struct {
	ext, contentType, mainPart, mainXML, mediaDir string
}{
	{".docx", "application/vnd.openxmlformats-officedocument.wordprocessingml.document.main+xml",
		"word/document.xml", `<w:document xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main"><w:body><w:p><w:r><w:t>mdbench</w:t></w:r></w:p></w:body></w:document>`, "word/media"},
	{".xlsx", "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet.main+xml",
		"xl/workbook.xml", `<workbook xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main"><sheets><sheet name="Sheet1" sheetId="1"/></sheets></workbook>`, "xl/media"},
	{".pptx", "application/vnd.openxmlformats-officedocument.presentationml.presentation.main+xml",
		"ppt/presentation.xml", `<p:presentation xmlns:p="http://schemas.openxmlformats.org/presentationml/2006/main"/>`, "ppt/media"},
	{".xltx", "application/vnd.openxmlformats-officedocument.spreadsheetml.template.main+xml",
		"xl/workbook.xml", `<workbook xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main"><sheets><sheet name="Template" sheetId="1"/></sheets></workbook>`, "xl/media"},
}

// basePartCount is the number of parts every generated package has before media:
// [Content_Types].xml, _rels/.rels, docProps/core.xml, docProps/app.xml, the main part
// and its relationships.
const basePartCount = 6

// Sizes returns the file sizes of spec: a log-normal spread clipped to
// [MinBytes, MaxBytes], with one file at each bound, scaled so that the mean is
// MeanSize (within a byte per file). Deterministic in spec.Seed.
func (spec DataSpec) Sizes() []int64 {
	r := rand.New(rand.NewPCG(spec.Seed, 0x6d64626e))
	raw := make([]float64, spec.Files)
	for i := range raw {
		raw[i] = math.Exp(r.NormFloat64() * 1.1)
	}
	clip := func(x float64) float64 {
		return math.Min(float64(spec.MaxBytes), math.Max(float64(spec.MinBytes), x))
	}
	// The smallest and largest draws are pinned to the bounds; find the scale of the
	// others whose clipped mean makes the whole mean MeanSize (it grows with the scale).
	lo, hi := 1.0, float64(spec.MaxBytes)
	first, last := argmin(raw), argmax(raw)
	out := make([]int64, len(raw))
	for range 200 {
		scale := (lo + hi) / 2
		var sum int64
		for i, x := range raw {
			switch {
			case len(raw) >= 2 && i == first:
				out[i] = spec.MinBytes
			case len(raw) >= 2 && i == last:
				out[i] = spec.MaxBytes
			default:
				out[i] = int64(math.Round(clip(x * scale)))
			}
			sum += out[i]
		}
		if sum < spec.MeanSize*int64(len(raw)) {
			lo = scale
		} else {
			hi = scale
		}
	}
	return out
}

func argmin(s []float64) int { return slices.Index(s, slices.Min(s)) }
func argmax(s []float64) int { return slices.Index(s, slices.Max(s)) }

// partCounts gives each file a number of parts growing with the square root of its size,
// at least basePartCount+1, so that the mean number of objects (1 + parts) is MeanObjects.
func (spec DataSpec) partCounts(sizes []int64) []int {
	roots, sum := make([]float64, len(sizes)), 0.0
	for i, s := range sizes {
		roots[i] = math.Sqrt(float64(s))
		sum += roots[i]
	}
	target := float64(spec.MeanObjects-1) * float64(len(sizes))
	out := make([]int, len(sizes))
	for i := range sizes {
		out[i] = max(basePartCount+1, int(math.Round(roots[i]/sum*target)))
	}
	return out
}

// manifest is the cache's index of a generated data set.
type manifest struct {
	Spec  DataSpec   `json:"spec"`
	Files []DataFile `json:"files"`
}

// LoadOrGenerate returns the data set of spec under dir, generating it the first time
// (and whenever the cached manifest does not match spec or a file is missing or of the
// wrong size). Generating the seed's set writes about 762 MB.
func LoadOrGenerate(dir string, spec DataSpec) ([]DataFile, error) {
	if spec.Files < 1 || spec.MinBytes < 1024 || spec.MaxBytes < spec.MinBytes ||
		spec.MeanSize < spec.MinBytes || spec.MeanSize > spec.MaxBytes || spec.MeanObjects < basePartCount+2 {
		return nil, fmt.Errorf("data set: invalid spec %+v", spec)
	}
	dir = filepath.Join(dir, fmt.Sprintf("seed%d-n%d-mean%d", spec.Seed, spec.Files, spec.MeanSize))
	if files, ok := loadManifest(dir, spec); ok {
		return files, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("data set: %w", err)
	}
	sizes := spec.Sizes()
	parts := spec.partCounts(sizes)
	files := make([]DataFile, len(sizes))
	for i, size := range sizes {
		t := officeTypes[i%len(officeTypes)]
		name := fmt.Sprintf("f%04d%s", i+1, t.ext)
		path := filepath.Join(dir, name)
		// Zip headers make the size hard to predict: write once, then again with the
		// media budget corrected by the difference (stored media make it exact).
		var fi os.FileInfo
		for adjust := int64(0); ; {
			if err := writeOffice(path, i, size+adjust, parts[i], spec.Seed); err != nil {
				return nil, fmt.Errorf("data set: writing %s: %w", name, err)
			}
			var err error
			if fi, err = os.Stat(path); err != nil {
				return nil, fmt.Errorf("data set: %w", err)
			}
			if fi.Size() == size || adjust != 0 {
				break
			}
			adjust = size - fi.Size()
		}
		files[i] = DataFile{Name: name, Path: path, Size: fi.Size(), Parts: parts[i]}
	}
	b, _ := json.MarshalIndent(manifest{Spec: spec, Files: files}, "", " ")
	if err := os.WriteFile(filepath.Join(dir, "manifest.json"), b, 0o644); err != nil {
		return nil, fmt.Errorf("data set: %w", err)
	}
	return files, nil
}

func loadManifest(dir string, spec DataSpec) ([]DataFile, bool) {
	b, err := os.ReadFile(filepath.Join(dir, "manifest.json"))
	if err != nil {
		return nil, false
	}
	var m manifest
	if json.Unmarshal(b, &m) != nil || m.Spec != spec || len(m.Files) != spec.Files {
		return nil, false
	}
	for _, f := range m.Files {
		fi, err := os.Stat(f.Path)
		if err != nil || fi.Size() != f.Size {
			return nil, false
		}
	}
	return m.Files, true
}

// writeOffice writes file i of the data set: a valid Office Open XML package of the
// type i selects, with parts entries, grown to about size bytes with media parts of
// incompressible (stored) pseudo-random bytes that begin with a PNG signature.
func writeOffice(path string, i int, size int64, parts int, seed uint64) (err error) {
	t := officeTypes[i%len(officeTypes)]
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}()
	bw := bufio.NewWriterSize(f, 256<<10)
	zw := zip.NewWriter(bw)
	mod := time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)
	add := func(name, content string) error {
		w, err := zw.CreateHeader(&zip.FileHeader{Name: name, Method: zip.Deflate, Modified: mod})
		if err != nil {
			return err
		}
		_, err = io.WriteString(w, content)
		return err
	}
	media := parts - basePartCount
	types := `<?xml version="1.0" encoding="UTF-8" standalone="yes"?>
<Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types"><Default Extension="rels" ContentType="application/vnd.openxmlformats-package.relationships+xml"/><Default Extension="xml" ContentType="application/xml"/><Default Extension="png" ContentType="image/png"/><Override PartName="/` + t.mainPart + `" ContentType="` + t.contentType + `"/><Override PartName="/docProps/core.xml" ContentType="application/vnd.openxmlformats-package.core-properties+xml"/><Override PartName="/docProps/app.xml" ContentType="application/vnd.openxmlformats-officedocument.extended-properties+xml"/></Types>`
	rels := `<?xml version="1.0" encoding="UTF-8" standalone="yes"?>
<Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships"><Relationship Id="rId1" Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/officeDocument" Target="` + t.mainPart + `"/><Relationship Id="rId2" Type="http://schemas.openxmlformats.org/package/2006/relationships/metadata/core-properties" Target="docProps/core.xml"/><Relationship Id="rId3" Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/extended-properties" Target="docProps/app.xml"/></Relationships>`
	core := `<?xml version="1.0" encoding="UTF-8" standalone="yes"?>
<cp:coreProperties xmlns:cp="http://schemas.openxmlformats.org/package/2006/metadata/core-properties" xmlns:dc="http://purl.org/dc/elements/1.1/"><dc:title>mdbench file ` + fmt.Sprint(i+1) + `</dc:title><dc:creator>mdbench</dc:creator></cp:coreProperties>`
	app := `<?xml version="1.0" encoding="UTF-8" standalone="yes"?>
<Properties xmlns="http://schemas.openxmlformats.org/officeDocument/2006/extended-properties"><Application>mdbench</Application></Properties>`
	var mainRels string
	for m := 1; m <= media; m++ {
		mainRels += fmt.Sprintf(`<Relationship Id="rIdM%d" Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/image" Target="media/image%d.png"/>`, m, m)
	}
	dir := filepath.Dir(t.mainPart)
	for _, p := range []struct{ name, content string }{
		{"[Content_Types].xml", types}, {"_rels/.rels", rels},
		{"docProps/core.xml", core}, {"docProps/app.xml", app},
		{t.mainPart, `<?xml version="1.0" encoding="UTF-8" standalone="yes"?>` + "\n" + t.mainXML},
		{dir + "/_rels/" + filepath.Base(t.mainPart) + ".rels", `<?xml version="1.0" encoding="UTF-8" standalone="yes"?>` + "\n" +
			`<Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships">` + mainRels + `</Relationships>`},
	} {
		if err := add(p.name, p.content); err != nil {
			return err
		}
	}
	// Media: the rest of the size, split evenly; each entry costs ~100 bytes of headers.
	overhead := int64(2048 + 200*parts)
	left := max(int64(media)*16, size-overhead-int64(len(mainRels)))
	rng := rand.NewChaCha8(chachaSeed(seed, i))
	sig := []byte("\x89PNG\r\n\x1a\n")
	for m := 1; m <= media; m++ {
		n := left / int64(media-m+1)
		left -= n
		w, err := zw.CreateHeader(&zip.FileHeader{Name: fmt.Sprintf("%s/image%d.png", t.mediaDir, m), Method: zip.Store, Modified: mod})
		if err != nil {
			return err
		}
		if _, err := w.Write(sig[:min(int64(len(sig)), n)]); err != nil {
			return err
		}
		if n > int64(len(sig)) {
			if _, err := io.CopyN(w, rng, n-int64(len(sig))); err != nil {
				return err
			}
		}
	}
	if err := zw.Close(); err != nil {
		return err
	}
	return bw.Flush()
}

func chachaSeed(seed uint64, i int) [32]byte {
	var s [32]byte
	for k := range 8 {
		s[k] = byte(seed >> (8 * k))
		s[8+k] = byte(uint64(i) >> (8 * k))
	}
	copy(s[16:], "mdbench-dataset!")
	return s
}

// errNoFiles is returned when a workload is asked of an empty data set.
var errNoFiles = errors.New("data set is empty")

// QuickData is a small data set for --quick runs and CI: 40 files of 20 KB to 1 MB,
// 100 KB on average, with as many objects per file as the published data set, so that a
// submission costs Core about as much scanning.
var QuickData = DataSpec{
	Files: 40, MinBytes: 20_000, MaxBytes: 1_000_000, MeanSize: 100_000,
	MeanObjects: 65, Seed: 1,
}
