package proxy

import (
	"fmt"
	"math"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// rcvLowatWakes: Linux wakes a read waiting on a mark when the mark drops
// (tcp_set_rcvlowat), which the batching counts on.
const rcvLowatWakes = true

// setRcvLowat sets the receive low-water mark (SO_RCVLOWAT) of the socket under rc to n
// bytes; it returns the error of either the socket's closing or setsockopt(2).
func setRcvLowat(rc syscall.RawConn, n int) error {
	return setsockopt(rc, unix.SOL_SOCKET, unix.SO_RCVLOWAT, n)
}

// setUserTimeout sets TCP_USER_TIMEOUT (tcp(7)) of the socket under rc to d, in whole
// milliseconds: at least 1, at most 2^31-1 (24.8 days; the option is a 32-bit count),
// 0 (the kernel's default: no bound) for d <= 0. It returns the error of either the
// socket's closing or setsockopt(2).
func setUserTimeout(rc syscall.RawConn, d time.Duration) error {
	ms := 0
	if d > 0 {
		ms = int(min(max(d.Milliseconds(), 1), math.MaxInt32))
	}
	return setsockopt(rc, unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, ms)
}

// userTimeoutBoundsZeroWindow reports whether the running kernel applies
// TCP_USER_TIMEOUT to data held behind a zero window: Linux 5.11 or later (commit
// 9d9b1ee0b2d1, "tcp: fix TCP_USER_TIMEOUT with zero window"). Before it, a client
// that keeps answering the window probes while it reads nothing was never cut. Read
// once, from uname(2).
var userTimeoutBoundsZeroWindow = sync.OnceValue(func() bool {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return false
	}
	return releaseAtLeast(unix.ByteSliceToString(u.Release[:]), 5, 11)
})

// releaseAtLeast reports whether the kernel release string (uname -r: "6.1.0-18-amd64",
// "5.10.0", "4.18.0-513.el8.x86_64") is major.minor or later; false when it does not
// start with two numbers.
func releaseAtLeast(release string, major, minor int) bool {
	var maj, mnr int
	if _, err := fmt.Sscanf(release, "%d.%d", &maj, &mnr); err != nil {
		return false
	}
	return maj > major || maj == major && mnr >= minor
}

// setsockopt sets the integer option opt of level to v on the socket under rc; it
// returns the error of either the socket's closing or setsockopt(2).
func setsockopt(rc syscall.RawConn, level, opt, v int) error {
	var serr error
	if err := rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), level, opt, v) }); err != nil {
		return err
	}
	return serr
}
