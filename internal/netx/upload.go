// Package netx is what mdproxy does below net/http because it was measured to pay on
// its workload (docs/performance.md): an upload copied to Core in large chunks, through
// a large socket send buffer. Everything else is net/http's own.
package netx

import (
	"io"
	"sync"
)

// UploadChunk is the most CopyUpload moves in one read and one write, in bytes: 1 MiB
// (io.Copy's buffer is 32 KiB). Fewer, larger system calls move an upload faster on
// one core.
const UploadChunk = 1 << 20

// maxUploadChunks is the most uploads that copy UploadChunk at a time at once: 32 MiB
// of buffers in all.
const maxUploadChunks = 32

// smallUploadChunk is the buffer of the uploads beyond maxUploadChunks, in bytes:
// io.Copy's.
const smallUploadChunk = 32 << 10

var (
	// uploadChunks holds a token for each upload that copies with a buffer of
	// uploadBuffers.
	uploadChunks = make(chan struct{}, maxUploadChunks)
	// uploadBuffers and smallUploadBuffers recycle the buffers of the uploads in flight.
	uploadBuffers      = sync.Pool{New: func() any { return new([UploadChunk]byte) }}
	smallUploadBuffers = sync.Pool{New: func() any { return new([smallUploadChunk]byte) }}
)

// CopyUpload copies r to w as io.Copy does, in reads and writes of up to UploadChunk
// bytes, for at most maxUploadChunks copies at once: the others copy 32 KiB at a time,
// so that many slow uploads do not hold a MiB each. w must not implement
// io.ReaderFrom (io.CopyBuffer would call it back). Safe for concurrent use.
func CopyUpload(w io.Writer, r io.Reader) (int64, error) {
	select {
	case uploadChunks <- struct{}{}:
		defer func() { <-uploadChunks }()
		buf := uploadBuffers.Get().(*[UploadChunk]byte)
		defer uploadBuffers.Put(buf)
		return io.CopyBuffer(w, r, buf[:])
	default:
		buf := smallUploadBuffers.Get().(*[smallUploadChunk]byte)
		defer smallUploadBuffers.Put(buf)
		return io.CopyBuffer(w, r, buf[:])
	}
}
