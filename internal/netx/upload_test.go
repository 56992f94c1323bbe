package netx

import (
	"bytes"
	"io"
	"testing"
)

// sizedReader gives n bytes and records the largest read asked of it.
type sizedReader struct{ n, largest int }

func (r *sizedReader) Read(p []byte) (int, error) {
	if r.n == 0 {
		return 0, io.EOF
	}
	r.largest = max(r.largest, len(p))
	k := min(len(p), r.n)
	r.n -= k
	return k, nil
}

// TestUploadChunksBounded: at most maxUploadChunks uploads copy with a buffer of
// UploadChunk at once; while they all do, another copies 32 KiB at a time.
func TestUploadChunksBounded(t *testing.T) {
	copyUpload := func() int {
		t.Helper()
		r := &sizedReader{n: 3 * UploadChunk}
		if n, err := CopyUpload(struct{ io.Writer }{io.Discard}, r); n != 3*UploadChunk || err != nil {
			t.Fatalf("CopyUpload = %d, %v; want %d bytes and no error", n, err, 3*UploadChunk)
		}
		return r.largest
	}
	if got := copyUpload(); got != UploadChunk {
		t.Errorf("an upload alone reads %d bytes at a time, want %d", got, UploadChunk)
	}
	for range maxUploadChunks {
		uploadChunks <- struct{}{} // as many uploads in flight, each with its MiB
	}
	got := copyUpload()
	for range maxUploadChunks {
		<-uploadChunks
	}
	if got != smallUploadChunk {
		t.Errorf("an upload beyond %d in flight reads %d bytes at a time, want %d", maxUploadChunks, got, smallUploadChunk)
	}
}

// BenchmarkCopyUpload copies 64 MiB with CopyUpload and, for comparison, with io.Copy's
// 32 KiB buffer, each into a writer that takes every byte at once: the cost of the
// copy's system calls is not in it (the peers benchmark's upload workload measures
// those), only that the large buffer costs nothing per byte.
func BenchmarkCopyUpload(b *testing.B) {
	src := bytes.Repeat([]byte{1}, 64<<20)
	for _, bc := range []struct {
		name string
		cp   func(io.Writer, io.Reader) (int64, error)
	}{{"chunks", CopyUpload}, {"io.Copy", io.Copy}} {
		b.Run(bc.name, func(b *testing.B) {
			b.SetBytes(int64(len(src)))
			for b.Loop() {
				if _, err := bc.cp(struct{ io.Writer }{io.Discard}, struct{ io.Reader }{bytes.NewReader(src)}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
