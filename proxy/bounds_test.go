package proxy

import (
	"errors"
	"io"
	"net"
	"testing"
	"time"
)

// TestLazyDeadlinesMaxConns: with maxConns, LazyDeadlines accepts no more connections
// while that many are open; closing one lets the next in, closing one twice gives back
// one slot only, and closing the listener ends an Accept that waits for a slot.
func TestLazyDeadlinesMaxConns(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := LazyDeadlines(l, 0, 2)
	defer ln.Close()
	type accepted struct {
		c   net.Conn
		err error
	}
	accept := func() <-chan accepted {
		ch := make(chan accepted, 1)
		go func() {
			c, err := ln.Accept()
			ch <- accepted{c, err}
		}()
		return ch
	}
	got := func(ch <-chan accepted) accepted {
		t.Helper()
		select {
		case a := <-ch:
			return a
		case <-time.After(10 * time.Second):
			t.Fatal("Accept still waits after 10 s")
			return accepted{}
		}
	}
	dial := func() {
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
	}

	var open []net.Conn
	for range 2 {
		dial()
		a := got(accept())
		if a.err != nil {
			t.Fatalf("Accept under the bound = %v", a.err)
		}
		open = append(open, a.c)
	}
	dial() // in the backlog: Accept would take it at once without the bound
	third := accept()
	select {
	case a := <-third:
		t.Fatalf("Accept with 2 of 2 connections open returned %v, %v; want it to wait", a.c, a.err)
	case <-time.After(50 * time.Millisecond): // only a missing bound can fail here
	}
	open[0].Close()
	open[0].Close() // once only
	a := got(third)
	if a.err != nil {
		t.Fatalf("Accept once a connection closed = %v, want the waiting one", a.err)
	}
	defer a.c.Close()
	if n := len(ln.(*lazyListener).slots); n != 2 {
		t.Errorf("%d slots taken with 2 connections open (one closed twice), want 2", n)
	}

	fourth := accept() // 2 open again: waits
	ln.Close()
	if a := got(fourth); !errors.Is(a.err, net.ErrClosed) {
		t.Errorf("Accept waiting for a slot when the listener closed = %v, %v; want net.ErrClosed", a.c, a.err)
	}
	open[1].Close()
}

// discardConn is a connection whose writes succeed and go nowhere.
type discardConn struct{ net.Conn }

func (discardConn) Write(p []byte) (int, error) { return len(p), nil }

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
