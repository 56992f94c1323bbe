package bench

import (
	"context"
	"fmt"

	"github.com/mdproxy/mdproxy/internal/redisproc"
)

// redisServerPath is where FindRedisServer looks for redis-server when it is not on
// PATH (Debian's package puts it there); a variable so that a test can pretend it
// absent.
var redisServerPath = redisproc.DefaultPath

// ErrNoRedisServer is wrapped by the error of FindRedisServer and StartRedisServer when
// redis-server is not installed (it is redisproc.ErrNotFound).
var ErrNoRedisServer = redisproc.ErrNotFound

// FindRedisServer returns the path of redis-server, on PATH or at
// /usr/bin/redis-server, or an error wrapping ErrNoRedisServer that names Debian's
// package and says that a Proxy-NxR case needs it.
func FindRedisServer() (string, error) {
	bin, err := redisproc.Find(redisServerPath)
	if err != nil {
		return "", fmt.Errorf("%w: a Proxy-NxR case runs its replicas on a Redis of its own", err)
	}
	return bin, nil
}

// StartRedisServer starts Debian's redis-server as a child process (redisproc.Start) on
// a free loopback port, with nothing persisted (--save "", --appendonly no) and its
// files in a temporary directory of its own, and returns once it answers PING: its URL,
// redis://127.0.0.1:port/0, and stop, which stops it (SIGTERM, then SIGKILL after 10 s),
// waits for the process to exit and removes the directory. stop may be called more than
// once, from any goroutine; later calls return the first one's error. It returns an
// error when redis-server exited before it was asked to, or not cleanly, with the end
// of its log. ctx bounds the wait for PING only. On Linux the server is killed (SIGKILL)
// if the process that started it dies without calling stop. The Env.StartRedis of every
// Env that leaves it nil.
func StartRedisServer(ctx context.Context) (url string, stop func() error, err error) {
	bin, err := FindRedisServer()
	if err != nil {
		return "", nil, err
	}
	s, err := redisproc.Start(ctx, redisproc.Options{Bin: bin})
	if err != nil {
		return "", nil, err
	}
	return s.URL(), s.Stop, nil
}
