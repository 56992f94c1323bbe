// Package coresim emulates OPSWAT MetaDefender Core for mdproxy's tests, demo and
// benchmark: it answers Core's REST API as Core does (shared/core-api/README.md and
// OPSWAT's OpenAPI description), and it spends virtual CPU time as Core does, so that
// polling slows scanning down.
//
// # API
//
// POST /file reads and inspects the upload (Inspect): it hashes it (md5, sha1, sha256),
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
// Model holds V virtual cores (CORESIM_CORES, default 8, the published benchmark's
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
// the cores (the network), then a worker receives it and checks Core's own limit at that instant, so
// that fetches reach the limiter one after another; an accepted fetch then queues again
// for its answer. Scans share what is left, one core at most per file, up to V files at
// once, the rest waiting in the scan queue (CORESIM_QUEUE_SIZE, default 4000; beyond it
// POST /file answers 503 "Server is too busy. Try again later.").
//
// The defaults reproduce the published benchmark of Core 5.13 on 8 vCPU (shared/seed)
// with mdbench's client (50 connections, a fetch round every 5 s):
//
//   - Scanning: 2000 submissions of ~65 objects and 952 KB took 26.9 min without
//     polling, about 6.5 core-seconds each; 83 ms an object and 600 ms a MiB, with the
//     time lost at the start and the end of the run, give that duration.
//   - Unlimited polling: Core answered 51 fetches a second and took 45.2 min. With 3
//     API workers and ~55 ms a poll, polls take 3 cores at most, at ~52 a second, and
//     scanning keeps 5: 26.9 × 8 / 5 = 43 min.
//   - Core's own limit of N a second (a burst of half a second's worth): a round of
//     ~1300 fetches over 50 connections at ~120 ms each lasts a few seconds and lets
//     a share of N through; the rest are refused at 0.4 ms of core time each, so
//     Rate-1 stays within a few percent of the time without polling (27.7 against
//     26.9 min).
//
// bench/results holds the table the defaults give.
//
// # Time
//
// Every duration the emulator reports or is configured with is virtual. Speedup
// (CORESIM_SPEEDUP) virtual seconds pass per real second, so a 45-minute experiment can
// run in minutes; Run advances the model every Tick of real time, and tests advance it
// by hand (Sim.Advance) for exact, sleep-free checks. Core's own rate limit
// (CORESIM_FETCH_LIMIT, requests per virtual second on result polls and batch status)
// and the callback retry schedule run on the same virtual clock.
//
// # Callbacks
//
// With a callbackurl header, the complete result is POSTed there as JSON when the scan
// ends (the shared README says POST; the spec's prose mentions PUT). A failed delivery
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
