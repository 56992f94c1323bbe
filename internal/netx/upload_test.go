package netx

import (
	"bytes"
	"io"
	"net"
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

// BenchmarkRelayUpload relays 64 MiB over loopback TCP as mdproxy relays an upload to
// Core: a sender writing 32 KiB at a time (Go's HTTP clients), the relay reading its
// connection and writing to a second one, a receiver reading it all. It compares
// CopyUpload with io.Copy (docs/performance.md gives the figures).
func BenchmarkRelayUpload(b *testing.B) {
	const size = 64 << 20
	for _, bc := range []struct {
		name string
		cp   func(io.Writer, io.Reader) (int64, error)
	}{{"chunks", CopyUpload}, {"io.Copy", io.Copy}} {
		b.Run(bc.name, func(b *testing.B) {
			b.SetBytes(size)
			for b.Loop() {
				relayOnce(b, size, bc.cp)
			}
		})
	}
}

// relayOnce moves size bytes from a sender through a relay to a receiver, all on
// loopback, and returns when the receiver has them all.
func relayOnce(b *testing.B, size int, cp func(io.Writer, io.Reader) (int64, error)) {
	sink, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer sink.Close()
	relay, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer relay.Close()
	received := make(chan int64, 1)
	go func() {
		c, err := sink.Accept()
		if err != nil {
			received <- -1
			return
		}
		defer c.Close()
		n, _ := io.Copy(io.Discard, c)
		received <- n
	}()
	go func() {
		in, err := relay.Accept()
		if err != nil {
			return
		}
		defer in.Close()
		out, err := net.Dial("tcp", sink.Addr().String())
		if err != nil {
			return
		}
		defer out.Close()
		_, _ = cp(struct{ io.Writer }{out}, struct{ io.Reader }{in}) // as a request body: no WriterTo, no ReaderFrom
	}()
	c, err := net.Dial("tcp", relay.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	chunk := make([]byte, 32<<10)
	for sent := 0; sent < size; sent += len(chunk) {
		if _, err := c.Write(chunk); err != nil {
			b.Fatal(err)
		}
	}
	c.Close()
	if n := <-received; n != int64(size) {
		b.Fatalf("the receiver got %d bytes, want %d", n, size)
	}
}
