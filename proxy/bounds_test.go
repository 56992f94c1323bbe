package proxy

import (
	"errors"
	"io"
	"net"
	"testing"
	"time"
)

// TestUploadChunksBounded: at most maxUploadChunks uploads copy to Core with a buffer
// of UploadChunk at once; while they all do, another copies 32 KiB at a time.
func TestUploadChunksBounded(t *testing.T) {
	c := &coreConn{Conn: discardConn{}, closed: make(chan struct{})}
	copyUpload := func() int {
		t.Helper()
		r := &sizedReader{n: 3 * UploadChunk}
		if n, err := c.ReadFrom(r); n != 3*UploadChunk || err != nil {
			t.Fatalf("ReadFrom = %d, %v; want %d bytes and no error", n, err, 3*UploadChunk)
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
