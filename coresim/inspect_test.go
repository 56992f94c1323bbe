package coresim

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"testing"
)

// partType is the type inspect reports for a part name.
func partType(name string) string {
	switch path.Ext(name) {
	case ".xml", ".rels":
		return "XML"
	case ".png":
		return "PNG"
	case ".jpeg":
		return "JPG"
	case ".txt":
		return "TXT"
	}
	return "BIN"
}

var ooxmlKinds = []ooxmlKind{ooxmlDOCX, ooxmlXLSX, ooxmlPPTX, ooxmlXLTX}

// TestInspectOOXML checks what inspect reports of each Office Open XML type: the file's
// size, hashes and type, and each non-directory part's name, size and hashes.
func TestInspectOOXML(t *testing.T) {
	for _, k := range ooxmlKinds {
		t.Run(k.ext, func(t *testing.T) {
			f := ooxmlBuild(t, k)
			if f.dirs == 0 {
				t.Fatalf("ooxmlBuild(%s) has no directory entry, want some to check they are skipped", k.ext)
			}
			dir := t.TempDir()
			name := "sample." + k.ext
			in, n, err := inspect(bytes.NewReader(f.data), name, dir)
			if err != nil {
				t.Fatalf("inspect(%s) error = %v, want nil", name, err)
			}
			assertDirEmpty(t, dir)
			md, s1, s256 := hashesOf(f.data)
			want := object{Name: name, Size: int64(len(f.data)), Type: k.typ, MD5: md, SHA1: s1, SHA256: s256}
			got := in.File
			got.TypeDesc = ""
			if n != int64(len(f.data)) || got != want {
				t.Errorf("inspect(%s) file = %+v, %d bytes read, want %+v, %d", name, got, n, want, len(f.data))
			}
			if in.Corrupt || in.Infected() {
				t.Errorf("inspect(%s) corrupt, infected = %t, %t, want false, false", name, in.Corrupt, in.Infected())
			}
			if len(in.Parts) != len(f.parts) {
				t.Fatalf("inspect(%s) parts = %d, want %d (entries %d, directories %d)", name, len(in.Parts), len(f.parts), len(f.parts)+f.dirs, f.dirs)
			}
			if got, want := in.Objects(), 1+len(f.parts); got != want {
				t.Errorf("inspect(%s).Objects() = %d, want %d", name, got, want)
			}
			for i, p := range f.parts {
				md, s1, s256 := hashesOf(p.data)
				want := object{Name: p.name, Size: int64(len(p.data)), Type: partType(p.name), MD5: md, SHA1: s1, SHA256: s256}
				got := in.Parts[i]
				got.TypeDesc = ""
				if got != want {
					t.Errorf("inspect(%s) part %d = %+v, want %+v", name, i, got, want)
				}
			}
		})
	}
}

// TestInspectOOXMLSubmitted submits each type and checks the complete result lists
// every part, with the file's own hashes in file_info.
func TestInspectOOXMLSubmitted(t *testing.T) {
	h := newAPIHarness(t, nil)
	for _, k := range ooxmlKinds {
		t.Run(k.ext, func(t *testing.T) {
			f := ooxmlBuild(t, k)
			name := "sample." + k.ext
			id := h.submit(t, f.data, "filename", name)
			h.settle(t)
			res := h.result(t, id)
			md, s1, s256 := hashesOf(f.data)
			fi := res.FileInfo
			if fi.DisplayName != name || fi.FileSize != int64(len(f.data)) || fi.FileType != k.typ ||
				fi.MD5 != md || fi.SHA1 != s1 || fi.SHA256 != s256 {
				t.Errorf("GET /file/%s file_info = %+v, want %s of %d bytes, %s, md5 %s sha1 %s sha256 %s",
					id, fi, name, len(f.data), k.typ, md, s1, s256)
			}
			if res.ScanResults.ScanAllResultI != 0 || res.ScanResults.ProgressPercent != 100 {
				t.Errorf("GET /file/%s = %d at %d%%, want 0 at 100%%", id, res.ScanResults.ScanAllResultI, res.ScanResults.ProgressPercent)
			}
			ef := res.ExtractedFiles
			if ef == nil {
				t.Fatalf("GET /file/%s extracted_files = missing, want %d parts", id, len(f.parts))
			}
			if ef.FilesExtractedCount != len(f.parts) || len(ef.FilesInArchive) != len(f.parts) {
				t.Fatalf("GET /file/%s extracted_files count = %d listing %d, want %d", id, ef.FilesExtractedCount, len(ef.FilesInArchive), len(f.parts))
			}
			for i, p := range f.parts {
				_, _, s256 := hashesOf(p.data)
				got := ef.FilesInArchive[i]
				if got.DisplayName != p.name || got.FileSize != int64(len(p.data)) || got.SHA256 != s256 ||
					got.ScanAllResultI != 0 || got.ProgressPercent != 100 {
					t.Errorf("GET /file/%s files_in_archive[%d] = %s %d bytes %s, %d at %d%%, want %s %d bytes %s, 0 at 100%%",
						id, i, got.DisplayName, got.FileSize, got.SHA256, got.ScanAllResultI, got.ProgressPercent, p.name, len(p.data), s256)
				}
			}
			assertDirEmpty(t, h.sim.cfg.TempDir)
		})
	}
}

// TestInspectEICAR checks plain bodies: the string anywhere is found, a near miss is not.
func TestInspectEICAR(t *testing.T) {
	tests := []struct {
		name string
		body []byte
		want bool
	}{
		{"the string alone", eicar, true},
		{"inside text", withEICAR(1000, 500), true},
		{"at the end", withEICAR(1000, 1000-len(eicar)), true},
		{"past the first 64 KiB", withEICAR(200<<10, 150<<10), true},
		{"last byte missing", eicar[:len(eicar)-1], false},
		{"one byte changed", bytes.Replace(eicar, []byte("EICAR"), []byte("EICAX"), 1), false},
		{"clean text", bytes.Repeat([]byte("clean "), 1000), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			in, _, err := inspect(bytes.NewReader(tt.body), "f.txt", dir)
			if err != nil {
				t.Fatalf("inspect(%s) error = %v, want nil", tt.name, err)
			}
			if got := in.Infected(); got != tt.want {
				t.Errorf("inspect(%s).Infected() = %t, want %t", tt.name, got, tt.want)
			}
			if len(in.Parts) != 0 || in.Corrupt {
				t.Errorf("inspect(%s) parts, corrupt = %d, %t, want 0, false", tt.name, len(in.Parts), in.Corrupt)
			}
			assertDirEmpty(t, dir)
		})
	}
}

// TestInspectEICARAcrossReads puts the string across every read boundary it can
// straddle: inspect reads 64 KiB at a time, and inspectStream must find a string split
// over two (or, for tiny reads, many) reads.
func TestInspectEICARAcrossReads(t *testing.T) {
	t.Run("inspect, 64 KiB boundary", func(t *testing.T) {
		// inspect reads a 4-byte head first, so its 64 KiB reads end at 4 + k×64 KiB;
		// cover both that and a plain 64 KiB boundary.
		const boundary = 64 << 10
		for at := boundary - len(eicar) - 8; at <= boundary+8; at++ {
			body := withEICAR(2*boundary, at)
			in, _, err := inspect(bytes.NewReader(body), "f.bin", t.TempDir())
			if err != nil {
				t.Fatalf("inspect(EICAR at %d) error = %v, want nil", at, err)
			}
			if !in.Infected() {
				t.Errorf("inspect(EICAR at %d).Infected() = false, want true", at)
			}
		}
	})
	for _, n := range []int{1, 2, 7, len(eicar) - 2, len(eicar) - 1, len(eicar), len(eicar) + 1, 100, 4096} {
		t.Run(fmt.Sprintf("reads of %d bytes", n), func(t *testing.T) {
			base := 3 * n
			for at := base - len(eicar); at <= base; at++ {
				if at < 0 {
					continue
				}
				body := withEICAR(base+2*len(eicar)+n, at)
				obj, size, err := inspectStream(&eicarChunkReader{data: body, n: n}, "f")
				if err != nil || size != int64(len(body)) {
					t.Fatalf("inspectStream(EICAR at %d) = %d bytes, error %v, want %d, nil", at, size, err, len(body))
				}
				if !obj.Infected {
					t.Errorf("inspectStream(reads of %d, EICAR at %d).Infected = false, want true", n, at)
				}
			}
			near := withEICAR(base+2*len(eicar)+n, base)
			near[base+len(eicar)-1] = '.'
			if obj, _, _ := inspectStream(&eicarChunkReader{data: near, n: n}, "f"); obj.Infected {
				t.Errorf("inspectStream(reads of %d, EICAR missing its last byte).Infected = true, want false", n)
			}
		})
	}
}

// TestInspectEICARInPart checks a compressed part holding the string makes the file
// infected, and that the result of the submission says so.
func TestInspectEICARInPart(t *testing.T) {
	f := ooxmlBuild(t, ooxmlDOCX, ooxmlPart{name: "word/embeddings/readme.txt", data: append([]byte("embedded note\n"), eicar...)})
	if bytes.Contains(f.data, eicar) {
		t.Fatalf("the built package holds the EICAR string uncompressed, want it only inside a deflated part")
	}
	dir := t.TempDir()
	in, _, err := inspect(bytes.NewReader(f.data), "infected.docx", dir)
	if err != nil {
		t.Fatalf("inspect(infected.docx) error = %v, want nil", err)
	}
	assertDirEmpty(t, dir)
	last := len(in.Parts) - 1
	if !in.Infected() || in.File.Infected || last < 0 || !in.Parts[last].Infected || in.Parts[last].Name != "word/embeddings/readme.txt" {
		t.Fatalf("inspect(infected.docx) infected = %t (file %t), last part %+v, want only the embedded part infected", in.Infected(), in.File.Infected, in.Parts[last])
	}
	for _, p := range in.Parts[:last] {
		if p.Infected {
			t.Errorf("inspect(infected.docx) part %s infected = true, want false", p.Name)
		}
	}

	h := newAPIHarness(t, nil)
	id := h.submit(t, f.data, "filename", "infected.docx")
	h.settle(t)
	res := h.result(t, id)
	if res.ScanResults.ScanAllResultI != 1 || res.ScanResults.ScanAllResultA != "Infected" ||
		res.ProcessInfo.Result != "Blocked" || res.ProcessInfo.BlockedReason != "Infected" {
		t.Errorf("GET /file/%s = %d %q %q (%q), want 1 Infected Blocked (Infected)", id, res.ScanResults.ScanAllResultI,
			res.ScanResults.ScanAllResultA, res.ProcessInfo.Result, res.ProcessInfo.BlockedReason)
	}
	engines := h.sim.cfg.Engines
	if len(res.ScanResults.ScanDetails) != len(engines) {
		t.Errorf("GET /file/%s scan_details = %d engines, want %d", id, len(res.ScanResults.ScanDetails), len(engines))
	}
	for _, e := range engines {
		if rep, ok := res.ScanResults.ScanDetails[e]; !ok || rep.ScanResultI != 1 || rep.ThreatFound == "" {
			t.Errorf("GET /file/%s scan_details[%s] = %+v, want scan_result_i 1 and a threat_found", id, e, rep)
		}
	}
	if res.ExtractedFiles == nil || len(res.ExtractedFiles.FilesInArchive) != len(in.Parts) {
		t.Fatalf("GET /file/%s extracted_files = %+v, want %d parts", id, res.ExtractedFiles, len(in.Parts))
	}
	for i, got := range res.ExtractedFiles.FilesInArchive {
		wantI, wantBy := 0, 0
		if i == last {
			wantI, wantBy = 1, len(engines)
		}
		if got.ScanAllResultI != wantI || got.DetectedBy != wantBy {
			t.Errorf("GET /file/%s files_in_archive[%d] (%s) = %d detected by %d, want %d by %d", id, i, got.DisplayName, got.ScanAllResultI, got.DetectedBy, wantI, wantBy)
		}
	}

	t.Run("plain body split at 64 KiB, submitted", func(t *testing.T) {
		id := h.submit(t, withEICAR(100<<10, 64<<10-30), "filename", "split.bin")
		h.settle(t)
		if res := h.result(t, id); res.ScanResults.ScanAllResultI != 1 || res.ProcessInfo.Result != "Blocked" {
			t.Errorf("GET /file/%s = %d %q, want 1 Blocked", id, res.ScanResults.ScanAllResultI, res.ProcessInfo.Result)
		}
	})
	assertDirEmpty(t, h.sim.cfg.TempDir)
}

// TestInspectCorrupt checks zip-looking files that cannot be read: inspect reports them
// corrupt without an error, removes its spool file, and the scan fails (3).
func TestInspectCorrupt(t *testing.T) {
	valid := ooxmlBuild(t, ooxmlDOCX).data
	badCRC := ooxmlBuild(t, ooxmlDOCX, ooxmlPart{name: "word/stored.bin", data: []byte("MARKER-0123456789-MARKER"), stored: true}).data
	badCRC = bytes.Clone(badCRC)
	i := bytes.Index(badCRC, []byte("MARKER-0123456789"))
	if i < 0 {
		t.Fatalf("stored part not found in the built package")
	}
	badCRC[i+7] ^= 0x01

	tests := []struct {
		name string
		body []byte
	}{
		{"PK header then garbage", append([]byte("PK\x03\x04"), ooxmlMedia(9, "", 5000)...)},
		{"PK header only", []byte("PK\x03\x04")},
		{"truncated", valid[:len(valid)/2]},
		{"central directory cut", valid[:len(valid)-10]},
		{"part with a bad CRC", badCRC},
	}
	h := newAPIHarness(t, nil)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			in, n, err := inspect(bytes.NewReader(tt.body), "broken.docx", dir)
			if err != nil {
				t.Fatalf("inspect(%s) error = %v, want nil", tt.name, err)
			}
			if !in.Corrupt || n != int64(len(tt.body)) {
				t.Errorf("inspect(%s) corrupt = %t, %d bytes, want true, %d", tt.name, in.Corrupt, n, len(tt.body))
			}
			md, _, _ := hashesOf(tt.body)
			if in.File.MD5 != md {
				t.Errorf("inspect(%s) md5 = %s, want %s", tt.name, in.File.MD5, md)
			}
			assertDirEmpty(t, dir)

			id := h.submit(t, tt.body, "filename", "broken.docx")
			h.settle(t)
			res := h.result(t, id)
			if res.ScanResults.ScanAllResultI != 3 || res.ScanResults.ScanAllResultA != "Failed" || res.ProcessInfo.Result != "Blocked" {
				t.Errorf("GET /file/%s (%s) = %d %q %q, want 3 Failed Blocked", id, tt.name,
					res.ScanResults.ScanAllResultI, res.ScanResults.ScanAllResultA, res.ProcessInfo.Result)
			}
			assertDirEmpty(t, h.sim.cfg.TempDir)
		})
	}
}

// TestInspectNotZip checks bodies that are not zips have no parts and no spool file.
func TestInspectNotZip(t *testing.T) {
	tests := []struct {
		name, file string
		body       []byte
		typ        string
	}{
		{"text", "notes.txt", []byte("just some text"), "TXT"},
		{"short PK", "a.bin", []byte("PK"), "BIN"},
		{"PK but not a local header", "b.docx", []byte("PK\x05\x06 and more"), "DOCX"},
		{"one byte", "c", []byte("x"), "BIN"},
		{"empty", "d", []byte{}, "BIN"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			in, n, err := inspect(bytes.NewReader(tt.body), tt.file, dir)
			if err != nil {
				t.Fatalf("inspect(%s) error = %v, want nil", tt.name, err)
			}
			md, s1, s256 := hashesOf(tt.body)
			if n != int64(len(tt.body)) || len(in.Parts) != 0 || in.Objects() != 1 || in.Corrupt ||
				in.File.Type != tt.typ || in.File.MD5 != md || in.File.SHA1 != s1 || in.File.SHA256 != s256 {
				t.Errorf("inspect(%s) = %d bytes, %d parts, %d objects, corrupt %t, %+v; want %d, 0, 1, false, %s %s %s %s",
					tt.name, n, len(in.Parts), in.Objects(), in.Corrupt, in.File, len(tt.body), tt.typ, md, s1, s256)
			}
			assertDirEmpty(t, dir)
		})
	}
}

// TestInspectErrors checks a failing read or spool gives an error and leaves no file.
func TestInspectErrors(t *testing.T) {
	errCut := errors.New("connection cut")
	valid := ooxmlBuild(t, ooxmlXLSX).data
	tests := []struct {
		name string
		body io.Reader
		dir  func(t *testing.T) string
		want error
	}{
		{"zip cut mid-read", &cutReader{data: valid[:len(valid)/2], err: errCut}, (*testing.T).TempDir, errCut},
		{"head cut", &cutReader{data: []byte("PK"), err: errCut}, (*testing.T).TempDir, errCut},
		{"plain cut mid-read", &cutReader{data: []byte("plain text"), err: errCut}, (*testing.T).TempDir, errCut},
		{"spool dir missing", bytes.NewReader(valid), func(t *testing.T) string { return filepath.Join(t.TempDir(), "missing") }, os.ErrNotExist},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := tt.dir(t)
			_, _, err := inspect(tt.body, "x.xlsx", dir)
			if !errors.Is(err, tt.want) {
				t.Errorf("inspect(%s) error = %v, want %v", tt.name, err, tt.want)
			}
			if _, statErr := os.Stat(dir); statErr == nil {
				assertDirEmpty(t, dir)
			}
		})
	}
}
