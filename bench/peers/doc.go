// Command peers measures mdproxy side by side with its peers on one machine: nginx,
// HAProxy and Caddy (the Debian packages), a bare net/http server answering a fixed 503
// (the ceiling of a limit answer in Go) and a bare httputil.ReverseProxy (the ceiling of
// forwarding in Go), each in front of the same stand-in upstream. A second bare 503
// server, with the client timeouts mdproxy's server has by default
// (MDPROXY_READ_HEADER_TIMEOUT, MDPROXY_IDLE_TIMEOUT), has a row of the limit answer of
// its own: what those timeouts cost a net/http server, apart from mdproxy's own work.
// The ratios and criteria stay against the bare server without them. So has a third
// bare server, with the same timeouts, answering 200 with one of the stand-in's results
// (1.7 KB, where the 503 is 67 bytes), beside the store hit: what net/http itself spends
// on a store hit's answer, apart from mdproxy's work. Two TCP relays
// (processes of this program knowing nothing of HTTP, one copying through a 1 MiB buffer
// as mdproxy does, one moving the bytes with Linux splice(2)) have rows of the upload of
// their own: what relaying an upload's bytes costs with no HTTP work, and what splice,
// the zero-copy path Go offers, does to it. It is the project's peers benchmark;
// one command, from the repository's root:
//
//	go run ./bench/peers -out bench/results/peers.md
//
// It builds ./cmd/mdproxy into a temporary directory (or runs -mdproxy-bin), starts every
// process on free loopback ports with its own configuration, pid and log files under a
// temporary directory, measures, prints a Markdown table and stops everything it started.
// A peer whose binary is absent gets one line saying so; the rest runs.
//
// # Fairness: who runs where
//
// The machine it was written for has 2 cores. Core 1 (-proxy-cpu) belongs to the proxy
// under test: every proxy runs there alone (taskset -c 1; GOMAXPROCS=1 for the Go ones,
// mdproxy, Caddy and the bare servers; nginx worker_processes 1; HAProxy nbthread 1).
// Core 0 (-load-cpu) holds everything else: wrk (-t2 -c64) or the upload client, and the
// stand-in upstream, a separate Go process of this program (GOMAXPROCS=1). The stand-in
// shares the load generator's core rather than the proxy's so that no proxy pays for the
// upstream's work, and every proxy meets the same load generator and the same upstream
// on the same core. The coordinating process (this program) only waits while a
// measurement runs. All proxies are started once and stay idle while another is
// measured; measurements are interleaved in rounds (every target once per round, the
// order rotated each round, 11 rounds of 4 s each by default) and each figure is the
// median of the rounds. A ratio (to the bare Go ceiling, to nginx) is the median of the
// rounds' ratios, each of two samples taken seconds apart in the same round: the speed
// of a shared virtual machine drifts by a third from one minute to the next, which a
// ratio of medians taken minutes apart would keep and a round's ratio cancels.
//
// # The limit: 50/s, burst 50, on GET /file/{id}
//
//   - mdproxy: MDPROXY_FILE_RESULT_RATE=50, MDPROXY_FILE_RESULT_BURST=50 (mdproxy's token bucket,
//     GCRA with x/time/rate's semantics), MDPROXY_BRIDGE=false.
//   - nginx: limit_req_zone (one key for the route) rate=50r/s, limit_req burst=50 nodelay,
//     limit_req_status 503: a leaky bucket that, with nodelay, admits what a token bucket of
//     rate 50 and size 50 admits.
//   - HAProxy has no token bucket. The configuration tracks the route in a stick-table
//     (one string key), counts the requests it lets through in gpc0 and refuses with 503
//     while gpc0_rate(1s), HAProxy's sliding estimate of that count over the last second,
//     is 50 or more. Refused requests are not counted (as a token bucket takes no token
//     for them), so the long-run rate is the same 50/s; the burst differs: at most about 50
//     in any second, where a full token bucket lets 50 at once and 50 more within the
//     second.
//   - Caddy: Debian's caddy has no rate-limit module (it is a third-party plugin), so it
//     has no limit-answer row.
//
// Every limit answer carries the same headers and body as mdproxy's (Retry-After: 1,
// application/json, X-Content-Type-Options: nosniff, {"err":"Too many requests for route
// file_result. Try again later."}), nginx's through error_page, HAProxy's through deny's
// own body.
//
// For the forwarded poll every request must reach the upstream: mdproxy runs with
// MDPROXY_FILE_RESULT_RATE=1000000 (it still takes a token for each poll, as a deployed
// mdproxy under its limit does), nginx and HAProxy without limit_req or stick-table, and
// every proxy keeps up to 256 idle connections to the upstream (nginx keepalive 256 and
// keepalive_requests lifted, Caddy keepalive_idle_conns_per_host 256, HAProxy's default
// reuse; the bare ReverseProxy's transport has MaxIdleConnsPerHost 256 as mdproxy's).
//
// # Workloads
//
//   - limit answer: wrk GET /file/<id>, nearly every answer the limit's 503; the answers
//     that were not 503 are counted (they are the ones the limit let through).
//   - forwarded poll: wrk GET /file/<id>, answered by the stand-in with a 1.7 KB result.
//   - upload: a 1 GiB (-upload-size) POST /file with Content-Length, zeros streamed by a
//     Go client, one connection at a time, MB/s (10^6 bytes) from the first byte sent to
//     the answer read; the stand-in counts the bytes it received and the upload counts
//     only when they are all there. nginx runs with proxy_request_buffering off and
//     client_max_body_size 0.
//   - store hit: mdproxy with the bridge on; a file submitted through it, whose result the
//     stand-in posted to the callback URL mdproxy gave it, then wrk GET /file/<that id>:
//     answered from mdproxy's store, never reaching the stand-in (counted). Its ceiling is
//     the bare 503 server, as the issue asks; the bare server answering a result's bytes
//     is measured beside it.
//   - RSS: a fresh mdproxy (bridge on, its default), 10 concurrent 200 MiB uploads
//     (-rss-uploads, -rss-size); the growth of its resident memory (VmRSS in
//     /proc/PID/status sampled every 10 ms, and VmHWM) above what it was before.
//
// The program exits 0 whatever it measured unless -check is given: then 1 when an
// acceptance criterion of issue 13 fails.
package main
