package sidecar

import (
	"log/slog"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/mdproxy/mdproxy/limiter"
	"github.com/mdproxy/mdproxy/metrics"
	"github.com/mdproxy/mdproxy/proxy"
)

// reloadDebounce is how long the limits file's directory must stay quiet after a change
// before the file is read: one edit may come as several events (an editor's write and
// rename, the three or four of a ConfigMap's swap), and a file being written must not
// be read half-way.
const reloadDebounce = 100 * time.Millisecond

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
	log     *slog.Logger
	reloads *prometheus.CounterVec // mdproxy_config_reloads_total
	live    *liveLimits
	proxy   *proxy.Proxy
}

// start reloads the limits on each signal of sigs (nil: none) and, when there is a
// limits file, reloadDebounce after the file, or the ..data symlink of a ConfigMap
// beside it, changed: it watches the file's directory (fsnotify), since an editor or
// Kubernetes replaces the file rather than write into it. A directory that cannot be
// watched is logged, and only signals reload then. start returns stop, which ends the
// watching and waits for it: no goroutine is left once stop returned.
func (r *limitsReloader) start(sigs <-chan os.Signal) (stop func()) {
	var w *fsnotify.Watcher
	if r.file != "" {
		var err error
		if w, err = fsnotify.NewWatcher(); err == nil {
			if err = w.Add(filepath.Dir(r.file)); err != nil {
				w.Close()
			}
		}
		if err != nil {
			w = nil
			r.log.Warn("not watching the limits file for changes: only SIGHUP reloads it",
				"file", r.file, "err", err.Error())
		} else {
			r.log.Info("watching the limits file", "file", r.file)
		}
	}
	if w == nil && sigs == nil {
		return func() {}
	}
	done, finished := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(finished)
		r.watch(done, sigs, w)
	}()
	return func() {
		close(done)
		<-finished
		if w != nil {
			w.Close()
		}
	}
}

// watch runs start's loop until done is closed. w may be nil (no file, or not watched).
func (r *limitsReloader) watch(done <-chan struct{}, sigs <-chan os.Signal, w *fsnotify.Watcher) {
	var events <-chan fsnotify.Event
	var errs <-chan error
	if w != nil {
		events, errs = w.Events, w.Errors
	}
	base := filepath.Base(r.file)
	quiet := time.NewTimer(time.Hour)
	quiet.Stop()
	defer quiet.Stop()
	for {
		select {
		case <-done:
			return
		case sig := <-sigs:
			r.reload("signal " + sig.String())
		case ev, ok := <-events:
			if !ok {
				events = nil
				continue
			}
			if name := filepath.Base(ev.Name); (name == base || name == configMapData) && ev.Op != fsnotify.Chmod {
				quiet.Reset(reloadDebounce)
			}
		case err, ok := <-errs:
			if !ok {
				errs = nil
				continue
			}
			r.log.Warn("watching the limits file", "file", r.file, "err", err.Error())
		case <-quiet.C:
			r.reload("file changed")
		}
	}
}

// reload reads the limits file and, when it is good, puts its limits in force: each
// route whose limit changed gets a new, full bucket (requests that hold the old one
// finish on it), the others keep theirs. A file that cannot be read or holds a bad
// setting changes nothing. Either way the outcome is counted
// (mdproxy_config_reloads_total) and logged, an error naming the file and the
// variable. trigger says what asked for the reload, for the log.
func (r *limitsReloader) reload(trigger string) {
	if r.file == "" {
		r.log.Warn("limits not reloaded: MDPROXY_LIMITS_FILE is not set, nothing to read", "trigger", trigger)
		return
	}
	limits, noEffect, err := loadLimits(r.environ, r.file)
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
