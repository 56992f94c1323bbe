package proxy

import (
	"sync"
	"syscall"
	"time"
)

// An upload reaches the proxy in TCP segments of at most 64 KiB, and each one that
// arrives while the proxy waits wakes it to read: on Linux the sending core interrupts
// the proxy's core, and the proxy then reads and writes to Core a few tens of KiB at a
// time. A receive low-water mark (SO_RCVLOWAT, socket(7)) makes the kernel wake the
// reader only once that many bytes are queued: fewer, larger reads and writes for the
// same bytes. Measured on loopback with the peers benchmark's upload client and
// stand-in on one core and mdproxy on the other (2 cores, ten interleaved rounds of
// 1 GiB uploads), a mark of 512 KiB took mdproxy from 0.86 to 0.90 of a direct upload's
// bytes a second, on average; 256 KiB and 1 MiB did as well. gRPC's POSIX TCP endpoint
// does the same for a large message whose length it knows (UpdateRcvLowat in
// tcp_posix.cc: the mark is the message's bytes still to come, less 16 KiB).
//
// A mark must never ask for bytes that will not come, or a read would wait until the
// body idle timeout cut it: it is at most the bytes of the body still to arrive (its
// Content-Length less what was read, less readBatchMargin for what net/http holds in its
// buffer of the connection), none for the body's last readBatchMargin bytes, and a mark
// that a read leaves asking for more than that is dropped as the read returns: net/http
// may read the rest of the body itself. A client that sends slower than a batch every
// readBatchWait is read as before: a mark asked for readBatchWait ago drops to one byte
// within half as long again, whether a read waits on it or none does yet (Linux wakes a
// waiting read when its mark drops, tcp_set_rcvlowat, since Linux 4.18; older kernels
// at the next segment), and the reads after a read that waited so ask for no mark until
// one finds a batch queued.

const (
	// readBatchMin is the smallest mark worth setting, and the smallest read that shows
	// a client sending fast enough to batch, in bytes: 64 KiB.
	readBatchMin = 64 << 10
	// readBatchMargin is the tail of a body read without a mark, in bytes: 64 KiB, more
	// than net/http's 4 KiB buffer of the connection may hold of the body.
	readBatchMargin = 64 << 10
	// readBatchWait bounds how long a read waits for its batch: between it and one and
	// a half times it, its mark drops to one byte.
	readBatchWait = 20 * time.Millisecond
)

// readBatch sets the receive low-water mark of a client connection for each read of
// one request body of a known length. before and after run in the reading goroutine,
// expire in the sweeping one, end in either or the handler's: every field below mu is
// guarded by it.
type readBatch struct {
	rc     syscall.RawConn
	length int64 // the body's Content-Length, bytes

	mu     sync.Mutex
	size   int       // the largest mark, bytes; 0 once the body is done with: no more marks
	mark   int       // the mark in force on the socket, bytes; 1 is the kernel's default
	armed  bool      // a read is waiting with a mark above one byte
	since  time.Time // when the mark above one byte was last asked for, by a read
	cut    bool      // the read waiting waited readBatchWait: its mark was dropped
	stream bool      // the client sends fast enough to batch the next read
}

// newReadBatch returns the readBatch of a body of length bytes read from rc, with marks
// of up to size bytes, swept by batches until end; nil when size or length leave
// nothing to batch, or where marks are not used (rcvLowatWakes).
func newReadBatch(rc syscall.RawConn, length int64, size int) *readBatch {
	if !rcvLowatWakes || size < readBatchMin || length < int64(size)+readBatchMargin {
		return nil
	}
	rb := &readBatch{rc: rc, length: length, size: size, mark: 1, stream: true}
	batches.add(rb)
	return rb
}

// before sets the mark for a read into a buffer of room bytes, read bytes of the body
// having been read.
func (rb *readBatch) before(read int64, room int) {
	rb.mu.Lock()
	defer rb.mu.Unlock()
	want := 1
	if left := rb.length - read - readBatchMargin; rb.size > 0 && rb.stream && left >= readBatchMin {
		want = int(max(min(left, int64(rb.size), int64(room)), 1))
	}
	rb.setMark(want)
	if rb.mark > 1 {
		rb.armed, rb.cut, rb.since = true, false, time.Now()
	}
}

// after records a read that returned n bytes, read bytes of the body having been read
// with them: the next read is batched if this one got its batch in time, or found at
// least readBatchMin bytes queued. A mark that asks for more than the bytes still to
// come drops to one byte at once: net/http itself may read the connection before the
// next read of ours (the rest of a body it discards once the answer is written).
func (rb *readBatch) after(read int64, n int) {
	rb.mu.Lock()
	defer rb.mu.Unlock()
	if rb.armed {
		rb.stream = !rb.cut
	} else {
		rb.stream = n >= readBatchMin
	}
	rb.armed = false
	if int64(rb.mark) > rb.length-read-readBatchMargin {
		rb.setMark(1)
	}
}

// expire drops a mark above one byte asked for readBatchWait or longer before now:
// that of a read waiting for its batch, or one left between reads while the body's
// reading has paused (the transport waiting on Core), which net/http's own reads of
// the connection would otherwise wait on.
func (rb *readBatch) expire(now time.Time) {
	rb.mu.Lock()
	defer rb.mu.Unlock()
	if rb.mark > 1 && now.Sub(rb.since) >= readBatchWait {
		if rb.armed {
			rb.cut = true
		}
		rb.setMark(1)
	}
}

// end drops the mark for good: the body is read, or the exchange is over, and the
// connection goes back to net/http as it came.
func (rb *readBatch) end() {
	rb.mu.Lock()
	rb.size, rb.armed = 0, false
	rb.setMark(1)
	rb.mu.Unlock()
	batches.remove(rb)
}

// setMark sets the socket's mark to n bytes, if it is not that already. Lowering the
// mark wakes a read waiting on bytes already queued (Linux: tcp_set_rcvlowat). A socket
// that refuses a mark gets no other for this body; one that refuses the mark of one
// byte is closed. Called with mu held.
func (rb *readBatch) setMark(n int) {
	if n == rb.mark {
		return
	}
	if err := setRcvLowat(rb.rc, n); err != nil {
		rb.size = 0
		if n > 1 {
			return
		}
	}
	rb.mark = n
}

// batches are the request bodies being read in batches now. A timer per read would
// cost the time batching saves (measured: arming one for each read took the whole
// gain); one goroutine sweeps them all every half readBatchWait instead, and exits
// when none is left.
var batches = newSweepSet(readBatchWait/2, (*readBatch).expire)
