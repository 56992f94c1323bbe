// Package netx is what mdproxy does below net/http because it was measured to pay
// (docs/performance.md): an upload copied to Core in large chunks.
package netx

import (
	"io"
	"sync"
)

// UploadChunk is the most CopyUpload moves in one read and write, in bytes.
const UploadChunk = 1 << 20

// maxUploadChunks uploads at once copy UploadChunk at a time (32 MiB in all); the others
// copy smallUploadChunk (io.Copy's) at a time.
const maxUploadChunks = 32

const smallUploadChunk = 32 << 10

var (
	uploadChunks       = make(chan struct{}, maxUploadChunks)
	uploadBuffers      = sync.Pool{New: func() any { return new([UploadChunk]byte) }}
	smallUploadBuffers = sync.Pool{New: func() any { return new([smallUploadChunk]byte) }}
)

// CopyUpload copies r to w as io.Copy does, in UploadChunk pieces for at most
// maxUploadChunks copies at once. w must not implement io.ReaderFrom. Safe for concurrent
// use.
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
