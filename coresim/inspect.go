package coresim

import (
	"archive/zip"
	"bytes"
	"crypto/md5"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path"
	"strings"
)

// eicar is the EICAR anti-malware test string (eicar.org): every engine reports a body
// that contains it as infected.
var eicar = []byte(`X5O!P%@AP[4\PZX54(P^)7CC)7}$EICAR-STANDARD-ANTIVIRUS-TEST-FILE!$H+H*`)

// object is one scanned object: the submitted file itself or a part extracted from it.
type object struct {
	Name     string // display name: the file name, or the part's path inside the archive
	Size     int64  // bytes (uncompressed for a part)
	Type     string // file type as Core names it, e.g. DOCX, XML, PNG
	TypeDesc string
	MD5      string
	SHA1     string
	SHA256   string
	Infected bool // contains the EICAR test string
}

// inspection is what reading a submission found.
type inspection struct {
	File  object   // the submitted file
	Parts []object // parts extracted from an Office Open XML (zip) file, in archive order
	// Corrupt is set when the file looks like a zip but cannot be opened: Core reports
	// such a file as failed to scan (scan_all_result_i 3).
	Corrupt bool
}

// Objects is the number of objects Core scans for the submission: the file and its parts.
func (in *inspection) Objects() int { return 1 + len(in.Parts) }

// Infected reports whether the file or any part contains the EICAR test string.
func (in *inspection) Infected() bool {
	if in.File.Infected {
		return true
	}
	for _, p := range in.Parts {
		if p.Infected {
			return true
		}
	}
	return false
}

// inspect reads body to its end: it hashes it, looks for the EICAR string and, when the
// body is a zip (Office Open XML is one), spools it to a temporary file in tmpDir
// ("" = os.TempDir()), opens it and inspects each part the same way. Nothing of the body
// is kept in memory beyond a read buffer; the temporary file is removed before inspect
// returns. It returns the number of bytes read and an error only when reading body or
// the temporary file fails.
func inspect(body io.Reader, name, tmpDir string) (*inspection, int64, error) {
	in := &inspection{}
	var head [4]byte
	n, err := io.ReadFull(body, head[:])
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		return nil, int64(n), err
	}
	first := head[:n]
	isZip := bytes.Equal(first, []byte("PK\x03\x04"))
	src := io.MultiReader(bytes.NewReader(first), body)

	var spool *os.File
	if isZip {
		spool, err = os.CreateTemp(tmpDir, "coresim-*.zip")
		if err != nil {
			return nil, int64(n), fmt.Errorf("spooling the upload: %w", err)
		}
		defer func() {
			spool.Close()
			os.Remove(spool.Name())
		}()
		src = io.TeeReader(src, spool)
	}
	obj, size, err := inspectStream(src, name)
	if err != nil {
		return nil, size, err
	}
	in.File = obj
	in.File.Type, in.File.TypeDesc = fileType(name, isZip)
	if !isZip {
		return in, size, nil
	}
	zr, err := zip.NewReader(spool, size)
	if err != nil {
		in.Corrupt = true
		return in, size, nil
	}
	for _, f := range zr.File {
		if f.FileInfo().IsDir() {
			continue
		}
		rc, err := f.Open()
		if err != nil {
			in.Corrupt = true
			continue
		}
		part, _, err := inspectStream(rc, f.Name)
		rc.Close()
		if err != nil {
			// A part that does not decompress (bad CRC, truncated) is a corrupt archive.
			in.Corrupt = true
			continue
		}
		part.Type, part.TypeDesc = fileType(f.Name, false)
		in.Parts = append(in.Parts, part)
	}
	return in, size, nil
}

// inspectStream hashes r and looks for the EICAR string across read boundaries.
func inspectStream(r io.Reader, name string) (object, int64, error) {
	hs := []hash.Hash{md5.New(), sha1.New(), sha256.New()}
	w := io.MultiWriter(hs[0], hs[1], hs[2])
	buf := make([]byte, 64<<10)
	carry := make([]byte, 0, 2*len(eicar)) // the tail of the previous reads
	var size int64
	infected := false
	for {
		n, err := r.Read(buf)
		if n > 0 {
			chunk := buf[:n]
			w.Write(chunk)
			size += int64(n)
			if !infected {
				// A string split across reads lies in carry + the head of chunk.
				edge := append(carry, chunk[:min(len(chunk), len(eicar)-1)]...)
				infected = bytes.Contains(edge, eicar) || bytes.Contains(chunk, eicar)
				tail := edge
				if len(chunk) >= len(eicar)-1 {
					tail = chunk
				}
				carry = append(carry[:0], tail[max(0, len(tail)-(len(eicar)-1)):]...)
			}
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return object{}, size, err
		}
	}
	return object{
		Name:     name,
		Size:     size,
		MD5:      hex.EncodeToString(hs[0].Sum(nil)),
		SHA1:     hex.EncodeToString(hs[1].Sum(nil)),
		SHA256:   hex.EncodeToString(hs[2].Sum(nil)),
		Infected: infected,
	}, size, nil
}

// fileType names a file's type from its extension as Core's file type engine reports it.
func fileType(name string, isZip bool) (typ, desc string) {
	switch strings.ToLower(path.Ext(name)) {
	case ".docx":
		return "DOCX", "Office Open XML Document"
	case ".xlsx":
		return "XLSX", "Office Open XML Workbook"
	case ".pptx":
		return "PPTX", "Office Open XML Presentation"
	case ".xltx":
		return "XLTX", "Office Open XML Workbook Template"
	case ".xml", ".rels":
		return "XML", "Extensible Markup Language"
	case ".png":
		return "PNG", "Portable Network Graphics"
	case ".jpg", ".jpeg":
		return "JPG", "JPEG image"
	case ".bin":
		return "BIN", "Binary data"
	case ".txt":
		return "TXT", "Plain text"
	case ".zip":
		return "ZIP", "ZIP compressed archive"
	}
	if isZip {
		return "ZIP", "ZIP compressed archive"
	}
	return "BIN", "Binary data"
}
