package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/mdproxy/mdproxy/internal/child"
)

// proc is a process the benchmark started (internal/child), in a process group of its
// own (nginx's workers are in it too), killed with its parent should the benchmark die.
type proc struct {
	name string
	*child.Proc
	log string
}

// lab holds the temporary directory and every process started in it.
type lab struct {
	dir     string
	taskset string // "" when absent: processes run unpinned
	procs   []*proc
}

// freePort returns a loopback address with a port nothing listens on now.
func freePort() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// baseEnv is the environment of every process started: PATH and a HOME of its own,
// nothing else of the benchmark's (no stray MDPROXY_ or GOMAXPROCS).
func (l *lab) baseEnv() []string {
	return []string{"PATH=" + os.Getenv("PATH"), "HOME=" + filepath.Join(l.dir, "home")}
}

// start runs argv pinned to cpu (when taskset is present), its output in name.log.
func (l *lab) start(name string, cpu int, env []string, argv ...string) (*proc, error) {
	logPath := filepath.Join(l.dir, name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if l.taskset != "" {
		argv = append([]string{l.taskset, "-c", strconv.Itoa(cpu)}, argv...)
	}
	cp, err := child.Start(context.Background(), argv[0], child.Options{
		Args: argv[1:], Env: env, Dir: l.dir, Group: true, Log: f, Name: name,
	})
	if err != nil {
		return nil, err
	}
	p := &proc{name: name, Proc: cp, log: logPath}
	l.procs = append(l.procs, p)
	return p, nil
}

// logTail is the end of p's output, for an error message.
func (p *proc) logTail() string {
	b, _ := os.ReadFile(p.log)
	b = bytes.TrimSpace(b)
	if len(b) > 1500 {
		b = b[len(b)-1500:]
	}
	return string(b)
}

// waitListening waits until addr accepts connections, p exits or timeout passes.
func (p *proc) waitListening(addr string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		select {
		case <-p.Done():
			return fmt.Errorf("%s exited (%v) before listening on %s: %s", p.name, p.Err(), addr, p.logTail())
		default:
		}
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			c.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not listening on %s after %v: %s", p.name, addr, timeout, p.logTail())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stop ends p's process group: SIGTERM, SIGKILL after 5 s, and SIGKILL to whatever is
// left of the group once its leader exited (a worker that outlived its master).
func (p *proc) stop() { _ = p.Stop(5 * time.Second) }

// close stops every process still running, the last started first.
func (l *lab) close() {
	for i := len(l.procs) - 1; i >= 0; i-- {
		l.procs[i].stop()
	}
	l.procs = nil
}

// remove stops p and forgets it.
func (l *lab) remove(p *proc) {
	p.stop()
	for i, q := range l.procs {
		if q == p {
			l.procs = append(l.procs[:i], l.procs[i+1:]...)
			break
		}
	}
}

// startSelf runs this program again in role, pinned to cpu with GOMAXPROCS=1, and
// waits for it to listen on addr.
func (l *lab) startSelf(name, role string, cpu int, addr string, extra ...string) (*proc, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	env := append(l.baseEnv(), "GOMAXPROCS=1", roleEnv+"="+role, addrEnv+"="+addr)
	p, err := l.start(name, cpu, append(env, extra...), exe)
	if err != nil {
		return nil, err
	}
	return p, p.waitListening(addr, 10*time.Second)
}

// mdproxyInstance is one mdproxy process and its addresses.
type mdproxyInstance struct {
	p           *proc
	addr, admin string
}

// startMdproxy starts bin on a free port, in front of upstream, pinned to cpu with
// GOMAXPROCS=1, its file_result limit rate/burst, the bridge on or off, and the
// variables extra (KEY=VALUE) added last.
func (l *lab) startMdproxy(name, bin string, cpu int, upstream string, bridge bool, rate, burst string, extra ...string) (*mdproxyInstance, error) {
	addr, err := freePort()
	if err != nil {
		return nil, err
	}
	admin, err := freePort()
	if err != nil {
		return nil, err
	}
	env := append(l.baseEnv(),
		"GOMAXPROCS=1",
		"MDPROXY_LISTEN_ADDR="+addr,
		"MDPROXY_ADMIN_ADDR="+admin,
		"MDPROXY_BRIDGE_LISTEN_ADDR=127.0.0.1:0",
		"MDPROXY_UPSTREAM_URL=http://"+upstream,
		"MDPROXY_BRIDGE="+strconv.FormatBool(bridge),
		"MDPROXY_FILE_RESULT_RATE="+rate,
		"MDPROXY_FILE_RESULT_BURST="+burst,
		"MDPROXY_SHUTDOWN_DELAY=0s",
	)
	p, err := l.start(name, cpu, append(env, extra...), bin)
	if err != nil {
		return nil, err
	}
	if err := p.waitListening(addr, 15*time.Second); err != nil {
		return nil, err
	}
	return &mdproxyInstance{p: p, addr: addr, admin: admin}, nil
}

// nginxConf is nginx's configuration: one worker, a server with the limit
// (limitAddr, also the upload's) and one without (fwdAddr). The limit answer is
// mdproxy's, through error_page; keepalive_requests are lifted on both sides, as no
// other proxy closes a connection after 1000 requests.
func nginxConf(dir, limitAddr, fwdAddr, upstream string) string {
	return fmt.Sprintf(`worker_processes 1;
daemon off;
master_process on;
pid %[1]s/nginx.pid;
error_log %[1]s/nginx-error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path %[1]s/nginx-body;
    proxy_temp_path %[1]s/nginx-proxy;
    fastcgi_temp_path %[1]s/nginx-fastcgi;
    uwsgi_temp_path %[1]s/nginx-uwsgi;
    scgi_temp_path %[1]s/nginx-scgi;
    keepalive_requests 1000000;
    keepalive_timeout 120s;
    client_max_body_size 0;
    proxy_request_buffering off;
    proxy_http_version 1.1;
    proxy_set_header Connection "";
    map $host $route_file_result { default file_result; }
    limit_req_zone $route_file_result zone=file_result:1m rate=50r/s;
    limit_req_status 503;
    upstream standin {
        server %[4]s;
        keepalive 256;
        keepalive_requests 1000000;
    }
    server {
        listen %[2]s;
        error_page 503 @limited;
        location @limited {
            default_type "application/json; charset=utf-8";
            add_header Retry-After 1 always;
            add_header X-Content-Type-Options nosniff always;
            return 503 '%[5]s';
        }
        location ~ ^/file/[^/]+$ {
            limit_req zone=file_result burst=50 nodelay;
            proxy_pass http://standin;
        }
        location / { proxy_pass http://standin; }
    }
    server {
        listen %[3]s;
        location / { proxy_pass http://standin; }
    }
}
`, dir, limitAddr, fwdAddr, upstream, limitBody)
}

// haproxyConf is HAProxy's configuration: one thread, a frontend with the limit
// (limitAddr, also the upload's) and one without (fwdAddr). See the package
// documentation for what the stick-table limit is next to a token bucket.
func haproxyConf(dir, limitAddr, fwdAddr, upstream string) string {
	return fmt.Sprintf(`global
    nbthread 1
    maxconn 4096
    pidfile %[1]s/haproxy.pid
defaults
    mode http
    timeout connect 5s
    timeout client 120s
    timeout server 120s
    timeout http-keep-alive 120s
frontend limit
    bind %[2]s
    stick-table type string len 16 size 16 expire 60s store gpc0,gpc0_rate(1s)
    acl file_result path_reg ^/file/[^/]+$
    acl poll method GET HEAD
    http-request track-sc0 str(file_result) if file_result poll
    http-request deny deny_status 503 content-type "application/json; charset=utf-8" hdr Retry-After 1 hdr X-Content-Type-Options nosniff string '%[5]s' if file_result poll { sc_gpc0_rate(0) ge 50 }
    http-request sc-inc-gpc0(0) if file_result poll
    default_backend standin
frontend forward
    bind %[3]s
    default_backend standin
backend standin
    server standin %[4]s
`, dir, limitAddr, fwdAddr, upstream, limitBody)
}

// caddyConf is Caddy's configuration: one site forwarding everything, up to 256 idle
// connections to the upstream; no admin endpoint, no HTTPS (what Caddy autosaves goes
// under XDG_CONFIG_HOME, in the temporary directory).
func caddyConf(addr, upstream string) string {
	return fmt.Sprintf(`{
    admin off
    auto_https off
}
http://%s {
    reverse_proxy %s {
        transport http {
            keepalive_idle_conns_per_host 256
        }
    }
}
`, addr, upstream)
}

// peer is a started peer's addresses: limit (with the 50/s limit; uploads too) and
// fwd (without).
type peer struct {
	name       string
	limit, fwd string
}

// startNginx, startHAProxy and startCaddy start a peer pinned to cpu.
func (l *lab) startNginx(bin string, cpu int, upstream string) (*peer, error) {
	la, fa, err := twoPorts()
	if err != nil {
		return nil, err
	}
	conf := filepath.Join(l.dir, "nginx.conf")
	if err := os.WriteFile(conf, []byte(nginxConf(l.dir, la, fa, upstream)), 0o644); err != nil {
		return nil, err
	}
	p, err := l.start("nginx", cpu, l.baseEnv(), bin, "-p", l.dir, "-c", conf, "-e", filepath.Join(l.dir, "nginx-error.log"))
	if err != nil {
		return nil, err
	}
	if err := p.waitListening(la, 10*time.Second); err != nil {
		return nil, err
	}
	return &peer{name: "nginx", limit: la, fwd: fa}, p.waitListening(fa, 10*time.Second)
}

func (l *lab) startHAProxy(bin string, cpu int, upstream string) (*peer, error) {
	la, fa, err := twoPorts()
	if err != nil {
		return nil, err
	}
	conf := filepath.Join(l.dir, "haproxy.cfg")
	if err := os.WriteFile(conf, []byte(haproxyConf(l.dir, la, fa, upstream)), 0o644); err != nil {
		return nil, err
	}
	p, err := l.start("haproxy", cpu, l.baseEnv(), bin, "-db", "-f", conf)
	if err != nil {
		return nil, err
	}
	if err := p.waitListening(la, 10*time.Second); err != nil {
		return nil, err
	}
	return &peer{name: "haproxy", limit: la, fwd: fa}, p.waitListening(fa, 10*time.Second)
}

func (l *lab) startCaddy(bin string, cpu int, upstream string) (*peer, error) {
	a, err := freePort()
	if err != nil {
		return nil, err
	}
	conf := filepath.Join(l.dir, "Caddyfile")
	if err := os.WriteFile(conf, []byte(caddyConf(a, upstream)), 0o644); err != nil {
		return nil, err
	}
	env := append(l.baseEnv(), "GOMAXPROCS=1",
		"XDG_DATA_HOME="+filepath.Join(l.dir, "caddy-data"), "XDG_CONFIG_HOME="+filepath.Join(l.dir, "caddy-config"))
	p, err := l.start("caddy", cpu, env, bin, "run", "--config", conf, "--adapter", "caddyfile")
	if err != nil {
		return nil, err
	}
	return &peer{name: "caddy", fwd: a}, p.waitListening(a, 10*time.Second)
}

func twoPorts() (string, string, error) {
	a, err := freePort()
	if err != nil {
		return "", "", err
	}
	for range 10 {
		b, err := freePort()
		if err != nil {
			return "", "", err
		}
		if b != a {
			return a, b, nil
		}
	}
	return "", "", errors.New("no second free port")
}

// buildMdproxy builds ./cmd/mdproxy of the module the working directory is in into
// dir and returns the binary's path.
func buildMdproxy(ctx context.Context, dir string) (string, error) {
	bin, err := child.Build(ctx, dir, "github.com/mdproxy/mdproxy/cmd/mdproxy")
	if err != nil {
		return "", fmt.Errorf("%w (run from the repository or give -mdproxy-bin)", err)
	}
	return bin, nil
}
