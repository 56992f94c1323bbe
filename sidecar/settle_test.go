package sidecar

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
)

// settleTime is the settle time of the fileSettle tests, on a fake clock: the
// default's.
const settleTime = time.Second

// settleFixture is a fileSettle of a file in a temporary directory, on a fake clock.
type settleFixture struct {
	t     *testing.T
	path  string
	clock *clockwork.FakeClock
	s     *fileSettle
}

func newSettleFixture(t *testing.T, content string) *settleFixture {
	t.Helper()
	path := filepath.Join(t.TempDir(), "limits.env")
	f := &settleFixture{t: t, path: path, clock: clockwork.NewFakeClock()}
	f.write(content)
	f.s = newFileSettle(f.clock, path, settleTime)
	t.Cleanup(f.s.stop)
	return f
}

// write writes content into the file in place, as `echo >` does.
func (f *settleFixture) write(content string) {
	f.t.Helper()
	if err := os.WriteFile(f.path, []byte(content), 0o644); err != nil {
		f.t.Fatal(err)
	}
}

// delivered reports whether C has a delivery now, taking it.
func (f *settleFixture) delivered() bool {
	select {
	case <-f.s.C():
		return true
	default:
		return false
	}
}

// settleAfter advances the clock by d and returns what due gives when C delivered then
// (nothing delivered: a zero limitsFile and false).
func (f *settleFixture) settleAfter(d time.Duration) (limitsFile, bool) {
	f.clock.Advance(d)
	if !f.delivered() {
		return limitsFile{}, false
	}
	return f.s.due()
}

// wantSettled checks that due gave the file content want.
func (f *settleFixture) wantSettled(when string, got limitsFile, ok bool, want string) {
	f.t.Helper()
	if !ok || got.err != nil || string(got.data) != want {
		f.t.Errorf("%s: due() = %q, %v, %v; want %q, nil, true", when, got.data, got.err, ok, want)
	}
}

// wantPending checks that due gave nothing.
func (f *settleFixture) wantPending(when string, got limitsFile, ok bool) {
	f.t.Helper()
	if ok {
		f.t.Errorf("%s: due() = %q, %v, true; want the file still settling", when, got.data, got.err)
	}
}

const (
	wholeFile = "MDPROXY_FILE_RESULT_RATE=100\nMDPROXY_FILE_RESULT_BURST=100\n"
	tornFile  = "MDPROXY_FILE_RESULT_RATE=1\n"
)

// TestFileSettleInPlaceWrite replays issue 29's trial on a fake clock: the file
// truncated, a part written 0.4 s later, the rest 0.4 s after that, each a change seen.
// Neither the empty file nor the torn one settles; the whole file does, one settle
// time after the last write and not before.
func TestFileSettleInPlaceWrite(t *testing.T) {
	for _, pause := range []time.Duration{150 * time.Millisecond, 400 * time.Millisecond} {
		t.Run(pause.String(), func(t *testing.T) {
			f := newSettleFixture(t, wholeFile)
			f.write("")
			f.s.changed()
			got, ok := f.settleAfter(pause)
			f.wantPending("the empty file, "+pause.String()+" on", got, ok)
			f.write(tornFile)
			f.s.changed()
			got, ok = f.settleAfter(pause)
			f.wantPending("the torn file, "+pause.String()+" on", got, ok)
			f.write(wholeFile)
			f.s.changed()
			got, ok = f.settleAfter(settleTime - time.Millisecond)
			f.wantPending("the whole file, a millisecond before its settle time", got, ok)
			got, ok = f.settleAfter(time.Millisecond)
			f.wantSettled("the whole file, at its settle time", got, ok, wholeFile)
			got, ok = f.settleAfter(10 * settleTime)
			f.wantPending("after it settled, no change seen", got, ok)
		})
	}
}

// TestFileSettleUnseenChange changes the file after the last change seen, without an
// event: the second reading differs, so the settle time starts again from it, and the
// file settles with the new content.
func TestFileSettleUnseenChange(t *testing.T) {
	f := newSettleFixture(t, "")
	f.write(tornFile)
	f.s.changed()
	f.write(wholeFile) // its event lost, or yet to come
	got, ok := f.settleAfter(settleTime)
	f.wantPending("a settle time after a change, read otherwise than at it", got, ok)
	got, ok = f.settleAfter(settleTime - time.Millisecond)
	f.wantPending("a millisecond before the second settle time", got, ok)
	got, ok = f.settleAfter(time.Millisecond)
	f.wantSettled("the second settle time", got, ok, wholeFile)
}

// TestFileSettleStaleDelivery takes a delivery of C that was due before the last
// change (the timer fired, its value not yet taken, when the change reset it): it is
// no settling; the settle time counts from the last change.
func TestFileSettleStaleDelivery(t *testing.T) {
	f := newSettleFixture(t, wholeFile)
	f.write(tornFile)
	f.s.changed()
	f.clock.Advance(settleTime) // fired; the value waits in C
	f.write(wholeFile)
	f.s.changed() // a change seen first, as select may pick it
	if !f.delivered() {
		t.Fatal("C has no value after the timer fired")
	}
	got, ok := f.s.due()
	f.wantPending("a delivery of before the last change", got, ok)
	got, ok = f.settleAfter(settleTime)
	f.wantSettled("a settle time after the last change", got, ok, wholeFile)
}

// TestFileSettleEmptyAndGone checks that a file that stays empty settles empty (no
// overrides), and one that stays away settles as the error of reading it.
func TestFileSettleEmptyAndGone(t *testing.T) {
	f := newSettleFixture(t, wholeFile)
	f.write("")
	f.s.changed()
	got, ok := f.settleAfter(settleTime)
	f.wantSettled("an empty file a settle time on", got, ok, "")

	if err := os.Remove(f.path); err != nil {
		t.Fatal(err)
	}
	f.s.changed()
	got, ok = f.settleAfter(settleTime)
	if !ok || got.err == nil || !errors.Is(got.err, fs.ErrNotExist) {
		t.Errorf("a removed file a settle time on: due() = %q, %v, %v; want the error of reading it, true", got.data, got.err, ok)
	}
}
