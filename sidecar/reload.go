package sidecar

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/mdproxy/mdproxy/limiter"
	"github.com/mdproxy/mdproxy/metrics"
	"github.com/mdproxy/mdproxy/proxy"
)

// configMapData is the symlink that Kubernetes swaps, in the directory of a mounted
// ConfigMap, to update every file of it at once: the file itself, a symlink through
// ..data, never changes.
const configMapData = "..data"

// Option tunes Run and Start.
type Option func(*runOptions)

type runOptions struct {
	reloadSignals <-chan os.Signal
}

// WithReloadSignals makes Run read the limits file (MDPROXY_LIMITS_FILE) again each
// time a signal arrives on sigs; mdproxy's main passes the channel that signal.Notify
// delivers SIGHUP to, so that SIGHUP reloads the limits rather than kill the process.
// Without a limits file, a signal is logged as having reloaded nothing. Without this
// option, Run reloads the file only when it changes and handles no signal for it: a
// program that runs mdproxy in-process keeps its signals to itself. Run stops reading
// sigs when it returns; the caller stops the delivery (signal.Stop).
func WithReloadSignals(sigs <-chan os.Signal) Option {
	return func(o *runOptions) { o.reloadSignals = sigs }
}

// liveLimits is the limiter.Set in force, which a reload swaps. It is the proxy.Limits
// of whatever reads the limits after the start (the admin's /config), and reports the
// client keys of the Set in force to metrics. Safe for concurrent use.
type liveLimits struct{ atomic.Pointer[limiter.Set] }

var (
	_ proxy.Limits               = (*liveLimits)(nil)
	_ metrics.ClientKeysReporter = (*liveLimits)(nil)
)

// Limiter returns the Limiter of route in the Set in force; nil when it is unlimited.
func (l *liveLimits) Limiter(route string) limiter.Limiter { return l.Load().Limiter(route) }

// ClientKeys reports the per-client shares of the Set in force (see limiter.Set). A
// share replaced by a reload starts from 0 keys and 0 untracked requests.
func (l *liveLimits) ClientKeys(f func(route string, tracked int, untracked uint64)) {
	l.Load().ClientKeys(f)
}

// limitsReloader reads the limits file again and puts its limits in force in a serving
// mdproxy, keeping the buckets of the routes whose limit did not change.
type limitsReloader struct {
	file    string            // MDPROXY_LIMITS_FILE; "" when none
	environ map[string]string // Run's, for the variables the file does not set
	settle  time.Duration     // MDPROXY_LIMITS_FILE_SETTLE
	clock   clockwork.Clock   // the settle time's
	log     *slog.Logger
	reloads *prometheus.CounterVec // mdproxy_config_reloads_total
	live    *liveLimits
	proxy   *proxy.Proxy
	// inForce is the content of the file whose limits are in force (Config.limitsRead
	// at start): a reading alike is no reload. Only the watching goroutine uses it.
	inForce []byte
}

// rewatchEvery is how often a directory of the limits file that cannot be watched
// (removed, renamed away, a symlink's target gone) is tried again, until it is watched.
const rewatchEvery = 100 * time.Millisecond

// The log lines of a watch of the limits file lost and back.
const (
	msgWatchLost = "lost the watch of the limits file: watching it again once its directory is back"
	msgWatchBack = "watching the limits file again"
)

// start reloads the limits on each signal of sigs (nil: none), at once, and, when there
// is a limits file, once the file has settled (see fileSettle) after it, or the ..data
// symlink of a ConfigMap beside it, changed: it watches the file's directory
// (fsnotify), since an editor or Kubernetes replaces the file rather than write into
// it, and, when the file is a symlink to a file of another directory, that directory
// too (see fileWatch). A directory that cannot be watched at start is logged, and only
// signals reload then. start returns stop, which ends the watching and waits for it:
// no goroutine is left once stop returned.
func (r *limitsReloader) start(sigs <-chan os.Signal) (stop func()) {
	var fw *fileWatch
	var syncErr error // a directory of the file, other than its own, not watched
	if r.file != "" {
		w, err := fsnotify.NewWatcher()
		if err == nil {
			fw = &fileWatch{w: w, file: r.file, dirs: map[string]bool{}}
			if _, syncErr = fw.sync(); !fw.dirs[filepath.Dir(r.file)] {
				err = syncErr
				w.Close()
			}
		}
		if err != nil {
			fw = nil
			r.log.Warn("not watching the limits file for changes: only SIGHUP reloads it",
				"file", r.file, "err", err.Error())
		} else {
			r.log.Info("watching the limits file", "file", r.file)
		}
	}
	if fw == nil && sigs == nil {
		return func() {}
	}
	done, finished := make(chan struct{}), make(chan struct{})
	var fs *fileSettle
	if fw != nil {
		fs = newFileSettle(r.clock, r.file, r.settle)
	}
	go func() {
		defer close(finished)
		r.watch(done, sigs, fw, fs, syncErr)
	}()
	return func() {
		close(done)
		<-finished
		if fw != nil {
			fw.w.Close()
		}
	}
}

// watch runs start's loop until done is closed. fw and fs may be nil (no file, or not
// watched); syncErr is fw's first sync's error. Each change of the file seen starts its
// settle time again (fs); once settled, the file is reloaded. While a directory of the
// file cannot be watched, watch tries again every rewatchEvery, and on each signal; it
// logs the loss at warn once, the return at info, and reads the file once it is back
// (it may have been written meanwhile, unseen).
func (r *limitsReloader) watch(done <-chan struct{}, sigs <-chan os.Signal, fw *fileWatch, fs *fileSettle, syncErr error) {
	var events <-chan fsnotify.Event
	var errs <-chan error
	var settled <-chan time.Time
	if fw != nil {
		events, errs, settled = fw.w.Events, fw.w.Errors, fs.C()
		defer fs.stop()
	}
	changed := func() {
		fs.changed()
		r.log.Debug("limits file changed: reading it once it has settled", "file", r.file, "settle", r.settle.String())
	}
	var retry *time.Ticker
	var retries <-chan time.Time // retry's, while a directory is not watched
	defer func() {
		if retry != nil {
			retry.Stop()
		}
	}()
	// synced records the outcome of a sync: the watch lost (err) or back, and returns
	// whether the file must be read again for it (back, or the symlink moved).
	synced := func(moved bool, err error) (reread bool) {
		switch {
		case err != nil && retry == nil:
			r.log.Warn(msgWatchLost, "file", r.file, "err", err.Error())
			retry = time.NewTicker(rewatchEvery)
			retries = retry.C
		case err == nil && retry != nil:
			retry.Stop()
			retry, retries = nil, nil
			r.log.Info(msgWatchBack, "file", r.file)
			return true
		}
		return moved
	}
	if fw != nil && syncErr != nil {
		synced(false, syncErr)
	}
	for {
		select {
		case <-done:
			return
		case sig := <-sigs:
			if fw != nil {
				synced(fw.sync())
			}
			r.reload("signal "+sig.String(), readLimitsFile(r.file))
		case ev, ok := <-events:
			if !ok {
				events = nil
				continue
			}
			ours := fw.event(ev)
			if synced(fw.sync()) || ours {
				changed()
			}
		case <-retries:
			if synced(fw.sync()) {
				changed()
			}
		case err, ok := <-errs:
			if !ok {
				errs = nil
				continue
			}
			r.log.Warn("watching the limits file", "file", r.file, "err", err.Error())
		case <-settled:
			if f, ok := fs.due(); ok {
				r.reload("file changed", f)
			}
		}
	}
}

// fileWatch is the fsnotify watch of a limits file: its directory and, when the file is
// a symlink whose target (every symlink resolved, filepath.EvalSymlinks) is in another
// directory, the target's directory too, resolved again after each event so that the
// watch follows a symlink pointed elsewhere. The symlinks between the two (a chain of
// them, a symlinked directory on the way) are not watched, but for the ..data symlink
// of a ConfigMap, which is in the file's directory. Not safe for concurrent use.
type fileWatch struct {
	w         *fsnotify.Watcher
	file      string          // MDPROXY_LIMITS_FILE
	target    string          // the file with its symlinks resolved; "" when it does not resolve
	targetDir string          // the watched directory whose events name target: its own, or the file's
	dirs      map[string]bool // the directories watched by w
}

// event takes in ev: a watched directory removed or renamed away is no longer watched
// (fsnotify dropped its watch; sync adds it again once it is back). It reports whether
// ev may change what the file holds: an event of the file itself, of its symlink's
// target or a ConfigMap's ..data beside it, or of a watched directory itself. Chmod
// events do not.
func (fw *fileWatch) event(ev fsnotify.Event) (concerns bool) {
	if ev.Op == fsnotify.Chmod {
		return false
	}
	dir, name := filepath.Split(ev.Name)
	dir = filepath.Clean(dir)
	switch self := filepath.Clean(ev.Name); {
	case fw.dirs[self]:
		if ev.Has(fsnotify.Remove) || ev.Has(fsnotify.Rename) {
			delete(fw.dirs, self)
		}
		return true
	case dir == filepath.Dir(fw.file) && (name == filepath.Base(fw.file) || name == configMapData):
		return true
	case fw.target != "" && dir == fw.targetDir && name == filepath.Base(fw.target):
		return true
	}
	return false
}

// sync resolves the file's symlinks again and makes w watch the directories that the
// file needs now, and no other: it adds those not watched (never, or no longer: see
// event), and removes the watch of a former target's
// directory. It reports whether the target moved, and an error when a directory is
// not watched: one that cannot be added (gone), or the file a symlink whose target
// does not resolve (its directory gone).
func (fw *fileWatch) sync() (moved bool, err error) {
	dir := filepath.Clean(filepath.Dir(fw.file))
	want := []string{dir}
	target, targetDir := "", ""
	if t, evalErr := filepath.EvalSymlinks(fw.file); evalErr == nil {
		target, targetDir = t, filepath.Dir(t)
		if realDir, dirErr := filepath.EvalSymlinks(dir); targetDir == dir || dirErr == nil && realDir == targetDir {
			targetDir = dir // one directory, watched once: its events name it as the file's
		} else {
			want = append(want, targetDir)
		}
	} else if fi, lstatErr := os.Lstat(fw.file); lstatErr == nil && fi.Mode()&os.ModeSymlink != 0 {
		err = fmt.Errorf("the limits file is a symlink whose target does not resolve: %w", evalErr)
	}
	moved = target != fw.target
	fw.target, fw.targetDir = target, targetDir
	for d := range fw.dirs {
		if !slices.Contains(want, d) {
			fw.w.Remove(d) // an error: its watch is gone already
			delete(fw.dirs, d)
		}
	}
	for _, d := range want {
		if fw.dirs[d] {
			continue
		}
		if addErr := fw.w.Add(d); addErr != nil {
			err = cmp.Or(err, fmt.Errorf("watching %s: %w", d, addErr))
			continue
		}
		fw.dirs[d] = true
	}
	return moved, err
}

// msgUnchanged is logged for a reading of the limits file alike the one in force.
const msgUnchanged = "limits file unchanged: the limits in force stay"

// reload puts in force the limits of f, a reading of the limits file, when it is good:
// each route whose limit changed gets a new, full bucket (requests that hold the old
// one finish on it), the others keep theirs. A file that could not be read or holds a
// bad setting changes nothing. Either way the outcome is counted
// (mdproxy_config_reloads_total) and logged, an error naming the file and the
// variable. A reading alike the file in force is no reload: nothing is counted nor
// changed, and it is logged at info when a signal asked for it (the operator hears
// back), at debug otherwise. trigger says what asked for the reload, for the log.
func (r *limitsReloader) reload(trigger string, f limitsFile) {
	if r.file == "" {
		r.log.Warn("limits not reloaded: MDPROXY_LIMITS_FILE is not set, nothing to read", "trigger", trigger)
		return
	}
	if f.err == nil && bytes.Equal(f.data, r.inForce) {
		level := slog.LevelDebug
		if strings.HasPrefix(trigger, "signal") {
			level = slog.LevelInfo
		}
		r.log.Log(context.Background(), level, msgUnchanged, "file", r.file, "trigger", trigger)
		return
	}
	limits, noEffect, err := loadLimits(r.environ, r.file, f)
	var next *limiter.Set
	var changed []string
	if err == nil {
		next, changed, err = r.live.Load().Update(limits)
	}
	if err != nil {
		r.reloads.WithLabelValues(metrics.ReloadError).Inc()
		r.log.Error("limits not reloaded: the previous limits stay", "file", r.file, "trigger", trigger,
			"err", err.Error())
		return
	}
	r.inForce = f.data
	r.live.Store(next)
	r.proxy.SetLimits(next)
	r.reloads.WithLabelValues(metrics.ReloadSuccess).Inc()
	if changed == nil {
		changed = []string{} // [] in the log, not null
	}
	r.log.Info("limits reloaded", "file", r.file, "trigger", trigger, "changed", changed)
	for _, route := range changed {
		l := next.Limit(route)
		r.log.Info("route limit changed", "route", route, "rate_per_s", l.Rate, "burst", l.Burst,
			"max_wait", l.MaxWait.String(), "client_limit", l.ClientLimit, "dry_run", l.DryRun)
	}
	warnNoEffect(r.log, noEffect)
}

// warnNoEffect logs, in one line, the settings that have no effect (see ineffective);
// nothing when there is none.
func warnNoEffect(log *slog.Logger, noEffect []string) {
	if len(noEffect) > 0 {
		log.Warn("settings without effect", "variables", noEffect)
	}
}

// newLimitsReloader returns the reloader of a running mdproxy's limits file
// (cfg.LimitsFile, "" when none): each reload is read with environ's variables beside
// the file's, logged to log, counted in m.ConfigReloads, and put in force in live and
// in h; the file cfg was read with is the one in force.
func newLimitsReloader(cfg *Config, environ map[string]string, log *slog.Logger, m *metrics.Metrics, live *liveLimits, h *proxy.Proxy) *limitsReloader {
	return &limitsReloader{file: cfg.LimitsFile, environ: environ, settle: cfg.LimitsFileSettle,
		clock: clockwork.NewRealClock(), log: log, reloads: m.ConfigReloads, live: live, proxy: h,
		inForce: cfg.limitsRead}
}
