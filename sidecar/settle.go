package sidecar

import (
	"time"

	"github.com/jonboulle/clockwork"
)

// fileSettle tells when the limits file, once it changed, has settled: read alike at
// the last change seen and a settle time (MDPROXY_LIMITS_FILE_SETTLE) later, with no
// change seen in between. A file written in place comes as several changes (truncated,
// then written in parts, each reported by fsnotify): it is put in force neither empty
// nor half-written, so long as its writer never pauses for the settle time between two
// parts. The second reading also catches a write whose event was lost or came late.
//
// A fileSettle is driven by one goroutine (limitsReloader.watch): changed at each change
// seen, due when C delivers. Not safe for concurrent use.
type fileSettle struct {
	path  string
	after time.Duration // the settle time
	clock clockwork.Clock
	timer clockwork.Timer
	// pending: a change was seen and its file is not yet settled; last is the file as
	// read at the last change, or at the last due that found it changed; deadline is
	// when it is settled if it reads alike then.
	pending  bool
	last     limitsFile
	deadline time.Time
}

// newFileSettle returns the fileSettle of the file at path, which settles after the
// given time on clock's timers. Nothing is pending.
func newFileSettle(clock clockwork.Clock, path string, after time.Duration) *fileSettle {
	t := clock.NewTimer(after)
	t.Stop()
	return &fileSettle{path: path, after: after, clock: clock, timer: t}
}

// C delivers when a pending file may have settled: call due then.
func (s *fileSettle) C() <-chan time.Time { return s.timer.Chan() }

// changed reads the file, at a change seen, and starts the settle time again.
func (s *fileSettle) changed() {
	s.last = readLimitsFile(s.path)
	s.restart()
}

func (s *fileSettle) restart() {
	s.pending = true
	s.deadline = s.clock.Now().Add(s.after)
	s.timer.Reset(s.after)
}

// due is called when C delivered. When the file is pending, its settle time passed,
// and it reads as it read at the last change, due returns that reading and true:
// nothing is pending any more. When it reads otherwise, that reading is the one to
// settle, and the settle time starts again. A delivery from before the last change
// (the timer's value left in C when changed reset it) is ignored.
func (s *fileSettle) due() (limitsFile, bool) {
	if !s.pending || s.clock.Now().Before(s.deadline) {
		return limitsFile{}, false
	}
	now := readLimitsFile(s.path)
	if !now.same(s.last) {
		s.last = now
		s.restart()
		return limitsFile{}, false
	}
	s.pending = false
	s.last = limitsFile{}
	return now, true
}

// stop stops the timer; nothing delivers on C any more.
func (s *fileSettle) stop() { s.timer.Stop() }
