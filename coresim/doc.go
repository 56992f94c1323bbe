// Package coresim emulates OPSWAT MetaDefender Core for mdproxy's tests, demo and
// benchmark: it answers Core's REST API as Core does (docs/core-api.md and
// OPSWAT's OpenAPI description), and it spends virtual CPU time as Core does, so that
// polling slows scanning down.
//
// # API
//
// POST /file reads and inspects the upload: it hashes it (md5, sha1, sha256),
// looks for the EICAR test string, and opens an Office Open XML file (a zip) to list
// its parts, each of which is an object scanned by every engine. The upload itself is
// not kept: only what results need. GET /file/{data_id} answers the result in progress
// (result Processing, in_queue, progress rising) and then complete, with
// progress_percentage filled both in scan_results and in process_info. An unknown
// data_id answers 404 {"err":"Not found"} (older OPSWAT guides say 404; the 4.18 spec
// lists only 200). Hash look-ups, cancellation, batches (pages of 50), the sanitized
// download (a deterministic stand-in of the original's size, since uploads are not
// kept), webhook status, version, readiness, node and engine status, login and logout
// are served as well; with CORESIM_APIKEY set, every API call needs it (or a session
// from POST /login) in its apikey header.
//
// # Resource model
//
// The model holds V virtual cores (CORESIM_CORES, default 8, the published benchmark's
// host). Every activity that costs Core CPU holds core time:
//
//	scan of a submission   n × SCAN_COST_OBJECT + MiB × SCAN_COST_MIB, n = 1 + parts
//	result poll / hash      POLL_COST_BASE + entries × POLL_COST_ENTRY,
//	                        entries = objects scanned so far × engines
//	batch status page       POLL_COST_BASE + files listed × BATCH_COST_FILE
//	receiving a fetch and   REJECT_COST (all that a rejection by Core's own rate
//	checking Core's limit   limit costs)
//
// Requests are served in arrival order by at most API_WORKERS cores (Core's web server
// threads), and a request is answered only once its core time is served. A fetch
// (result poll, batch status) first spends REQUEST_LATENCY, ±50% at random, outside
// the cores (the network), then a worker receives it and checks Core's own limit at
// that instant, so that fetches reach the limiter one after another. Over the limit
// (FETCH_LIMIT a second, FETCH_BURST at once), a fetch whose turn comes within
// FETCH_WAIT is held, on no worker, until its turn, as nginx's limit_req without
// nodelay holds it; a fetch whose turn is further away is answered 503 at once. An
// accepted fetch then queues again for its answer. Scans share what is left, one core
// at most per file, up to V files at once, the rest waiting in the scan queue
// (CORESIM_QUEUE_SIZE, default 4000; beyond it POST /file answers 503 "Server is too
// busy. Try again later.").
//
// The defaults reproduce the published benchmark of Core 5.13 on 8 vCPU
// (bench/PUBLISHED.md) with mdbench's client (120 connections, fetch rounds 5 s apart):
//
//   - Scanning: 2000 submissions of ~65 objects and 952 KB took 26.9 min without
//     polling, about 6.5 core-seconds each; 83 ms an object and 600 ms a MiB, with the
//     time lost at the start and the end of the run, give that duration.
//   - Unlimited polling: Core answered 51 fetches a second and took 45.2 min. Polls
//     of ~60 ms on 4 API workers take 4 cores during a round and none in the client's
//     pause between rounds; scanning keeps the rest.
//   - Core's own limit of N a second: OPSWAT documents neither its burst nor what
//     happens to a fetch just over the limit. The published figures fit a limiter that
//     holds such a fetch for up to 2 seconds before serving it: at 50 a second the
//     client's connections wait their turn and few fetches are refused (10.5%
//     published), while at 20, 10 and 1 a second most are refused at once and the
//     accepted rate stays near the limit only while a round lasts (11.0, 6.1 and 0.8
//     a second published). A refusal costs 0.4 ms of core time, so Rate-1 stays
//     within a few percent of the time without polling (27.7 against 26.9 min).
//
// bench/results holds the table the defaults give.
//
// # Time
//
// Every duration the emulator reports or is configured with is virtual. Speedup
// (CORESIM_SPEEDUP) virtual seconds pass per real second, so a 45-minute experiment can
// run in minutes; Run advances the model every Tick of real time, and tests advance it
// by hand for exact, sleep-free checks. Core's own rate limit (CORESIM_FETCH_LIMIT,
// requests per virtual second on result polls and batch status) and the callback retry
// schedule run on the same virtual clock.
//
// # Callbacks
//
// With a callbackurl header, the complete result is POSTed there as JSON when the scan
// ends (OPSWAT's documentation says POST, the spec's prose PUT). A failed delivery
// (no answer or not 2xx) is retried CORESIM_CALLBACK_RETRIES times, the first after
// CALLBACK_DELAY, each next one CALLBACK_INCREASE later than the previous gap, as Core's
// webhook settings do. Pending deliveries wait in a heap; CALLBACK_WORKERS goroutines
// send them, so thousands of scans never hold a goroutine each.
//
// # Bounded resources
//
// No goroutine per queued file or object: the model is advanced by one loop. Uploads are
// hashed while read; a zip is spooled to a temporary file, opened, and removed. Completed
// results are dropped after CORESIM_RETENTION (virtual).
//
// # Metrics
//
// The emulator's own Prometheus metrics, namespace coresim, on CORESIM_ADMIN_ADDR:
// queue length, files scanning, busy cores, virtual time, core-seconds spent by work,
// objects scanned, fetches served and rejected, callbacks delivered and failed.
package coresim
