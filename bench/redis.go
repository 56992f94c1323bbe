package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// The Redis of a Proxy-NxR case: Debian's redis-server, run by StartRedisServer.
const (
	// redisStartTimeout bounds the wait for a started redis-server to answer PING.
	redisStartTimeout = 10 * time.Second
	// redisStopGrace is how long stop waits after SIGTERM before it sends SIGKILL.
	redisStopGrace = 10 * time.Second
	// redisStartTries is how many free ports StartRedisServer tries when another
	// process takes the one it picked before redis-server could bind it.
	redisStartTries = 3
)

// redisServerPath is where FindRedisServer looks for redis-server when it is not on
// PATH (Debian's package puts it there); a variable so that a test can pretend it
// absent.
var redisServerPath = "/usr/bin/redis-server"

// ErrNoRedisServer is wrapped by the error of FindRedisServer and StartRedisServer when
// redis-server is not installed.
var ErrNoRedisServer = errors.New("redis-server not found")

// FindRedisServer returns the path of redis-server, on PATH or at
// /usr/bin/redis-server, or an error wrapping ErrNoRedisServer that names Debian's
// package.
func FindRedisServer() (string, error) {
	if p, err := exec.LookPath("redis-server"); err == nil {
		return p, nil
	}
	if _, err := os.Stat(redisServerPath); err == nil {
		return redisServerPath, nil
	}
	return "", fmt.Errorf("%w on PATH nor at %s: a Proxy-NxR case runs its replicas on a Redis of its own (Debian: apt-get install redis-server)",
		ErrNoRedisServer, redisServerPath)
}

// StartRedisServer starts Debian's redis-server as a child process on a free loopback
// port, with nothing persisted (--save "", --appendonly no) and its files in a
// temporary directory of its own, and returns once it answers PING (go-redis): its URL,
// redis://127.0.0.1:port/0, and stop, which stops it (SIGTERM, then SIGKILL after 10 s),
// waits for the process to exit and removes the directory. stop returns an error when
// redis-server exited before it was asked to, or not cleanly, with the end of its log.
// On Linux the server is killed (SIGKILL) if the process that started it dies without
// calling stop. The Env.StartRedis of every Env that leaves it nil.
func StartRedisServer(ctx context.Context) (url string, stop func() error, err error) {
	bin, err := FindRedisServer()
	if err != nil {
		return "", nil, err
	}
	dir, err := os.MkdirTemp("", "mdbench-redis-")
	if err != nil {
		return "", nil, err
	}
	var errs []error
	for range redisStartTries {
		s, err := startRedisOn(ctx, bin, dir)
		if err == nil {
			return s.url(), s.stop, nil
		}
		errs = append(errs, err)
		if !errors.Is(err, errRedisExited) {
			break // it did not exit early, so another port will not help
		}
	}
	_ = os.RemoveAll(dir)
	return "", nil, fmt.Errorf("starting %s: %w", bin, errors.Join(errs...))
}

// redisServer is one redis-server process.
type redisServer struct {
	cmd     *exec.Cmd
	addr    string // 127.0.0.1:port
	dir     string
	logFile string
	done    chan struct{} // closed once cmd.Wait returned
	waitErr error         // cmd.Wait's error, once done is closed

	stopOnce sync.Once
	stopErr  error
}

func (s *redisServer) url() string { return "redis://" + s.addr + "/0" }

// errRedisExited is wrapped by startRedisOn's error when redis-server exited before
// it answered, e.g. because its port was taken meanwhile.
var errRedisExited = errors.New("redis-server exited before it answered PING")

// startRedisOn runs bin on a free loopback port with its files in dir, and waits until
// it answers PING.
func startRedisOn(ctx context.Context, bin, dir string) (*redisServer, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	s := &redisServer{addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), dir: dir,
		logFile: filepath.Join(dir, "redis-"+strconv.Itoa(port)+".log"), done: make(chan struct{})}
	s.cmd = exec.Command(bin,
		"--port", strconv.Itoa(port),
		"--bind", "127.0.0.1",
		"--save", "",
		"--appendonly", "no",
		"--daemonize", "no",
		"--dir", dir,
		"--logfile", s.logFile,
	)
	s.cmd.Dir = dir
	s.cmd.SysProcAttr = redisSysProcAttr()
	if err := s.cmd.Start(); err != nil {
		return nil, fmt.Errorf("running %s: %w", bin, err)
	}
	go func() {
		s.waitErr = s.cmd.Wait()
		close(s.done)
	}()
	if err := s.waitReady(ctx); err != nil {
		_ = s.cmd.Process.Kill()
		<-s.done
		return nil, fmt.Errorf("port %d: %w%s", port, err, s.logTail())
	}
	return s, nil
}

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// waitReady waits until the server accepts a connection, then until it answers PING
// (go-redis) and is this process (INFO's process_id), for redisStartTimeout at most.
// It dials the port itself first, so that go-redis never logs a failed dial.
func (s *redisServer) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, redisStartTimeout)
	defer cancel()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	wait := func(last error) error {
		select {
		case <-s.done:
			return errRedisExited
		case <-ctx.Done():
			return fmt.Errorf("no answer within %v: %w", redisStartTimeout, errors.Join(ctx.Err(), last))
		case <-tick.C:
			return nil
		}
	}
	for {
		c, err := net.DialTimeout("tcp", s.addr, time.Second)
		if err == nil {
			c.Close()
			break
		}
		if err := wait(err); err != nil {
			return err
		}
	}
	rdb := redis.NewClient(&redis.Options{Addr: s.addr, DialTimeout: time.Second,
		ContextTimeoutEnabled: true, MaxRetries: -1, PoolSize: 1, DisableIdentity: true})
	defer rdb.Close()
	want := "process_id:" + strconv.Itoa(s.cmd.Process.Pid) + "\r\n"
	for {
		err := rdb.Ping(ctx).Err()
		if err == nil {
			info, ierr := rdb.Info(ctx, "server").Result()
			if ierr != nil {
				return fmt.Errorf("INFO server: %w", ierr)
			}
			if !strings.Contains(info, want) {
				// Another server holds the port; ours is to exit, unable to bind it.
				select {
				case <-s.done:
					return errRedisExited
				case <-time.After(time.Second):
					return errors.New("another server answers on its port")
				}
			}
			return nil
		}
		if err := wait(err); err != nil {
			return err
		}
	}
}

// stop stops the server once: SIGTERM, SIGKILL after redisStopGrace, then removes its
// directory. Its error says whether the server had exited on its own before, or did
// not exit cleanly.
func (s *redisServer) stop() error {
	s.stopOnce.Do(func() {
		var errs []error
		select {
		case <-s.done:
			errs = append(errs, fmt.Errorf("redis-server %s exited during the case: %v%s", s.addr, s.waitErr, s.logTail()))
		default:
			_ = s.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-s.done:
				if s.waitErr != nil {
					errs = append(errs, fmt.Errorf("redis-server %s at its stop: %v%s", s.addr, s.waitErr, s.logTail()))
				}
			case <-time.After(redisStopGrace):
				_ = s.cmd.Process.Kill()
				<-s.done
				errs = append(errs, fmt.Errorf("redis-server %s still running %v after SIGTERM: killed", s.addr, redisStopGrace))
			}
		}
		if err := os.RemoveAll(s.dir); err != nil {
			errs = append(errs, err)
		}
		s.stopErr = errors.Join(errs...)
	})
	return s.stopErr
}

// logTail returns the last lines of the server's log, for an error, or "" when it
// has none.
func (s *redisServer) logTail() string {
	b, _ := os.ReadFile(s.logFile)
	b = bytes.TrimSpace(b)
	if len(b) == 0 {
		return ""
	}
	lines := strings.Split(string(b), "\n")
	return "; its log ends:\n" + strings.Join(lines[max(0, len(lines)-10):], "\n")
}
