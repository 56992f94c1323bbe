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
//	                        entries = objects reported × engines
//	batch status page       POLL_COST_BASE + files listed × BATCH_COST_FILE
//	rejection by Core's     REJECT_COST
//	own rate limit
//
// Answers are served first, in arrival order, and a request is answered only once its
// core time is served; scans share what is left, one core at most per file, up to V files
// at once, the rest waiting in the scan queue (CORESIM_QUEUE_SIZE, default 4000; beyond
// it POST /file answers 503 "Server is too busy. Try again later.").
//
// The default costs come from the published benchmark of Core 5.13 on 8 vCPU
// (shared/seed): 2000 submissions of Office files (~65 objects each, 952 KB mean) took
// 26.9 min without any polling, so one submission costs about 8 × 26.9 × 60 / 2000 =
// 6.5 core-seconds: 65 × 90 ms + 0.93 MiB × 600 ms. Unlimited polling at 51 accepted
// fetches a second took 45.2 min, 18.3 min × 8 cores more, about 60 ms of core time per
// poll of a complete result of 65 objects × 7 engines: 2 ms + 455 × 130 µs. Under
// Core's own limits of 10 and 1 per second, clients offered 190 and 500 fetches a
// second, and the durations (28.6 and 27.7 min) leave about 0.4 ms per rejection.
// These are defaults to calibrate against; mdbench reproduces the table with them.
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
