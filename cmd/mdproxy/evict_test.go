package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/mdproxy/mdproxy/internal/redistest"
)

// Issue 29, black-box: the mdproxy binary on a real redis-server short of memory. The
// trial: with maxmemory 4mb and volatile-lru, results of the bridge filling Redis, the
// route's key was evicted 6 times in 30 s, each time a full bucket, and Core got 23 to
// 26 polls in 10 s for a bound of 22.

// redisTime returns Redis's clock in Unix microseconds.
func redisTime(t *testing.T, rdb *redis.Client) int64 {
	t.Helper()
	now, err := rdb.Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return now.UnixMicro()
}

// evict makes Redis itself evict key under its maxmemory-policy: it makes key the least
// recently used of all (RESTORE with IDLETIME, its value and TTL unchanged), then
// writes bulk values with a TTL, as the bridge's results are, until Redis has evicted
// it. It returns how many it wrote; it fails t if Redis kept key through 500 of them.
func evict(t *testing.T, rdb *redis.Client, key string, bulk *int) int {
	t.Helper()
	ctx := context.Background()
	dump, err := rdb.Dump(ctx, key).Result()
	if err != nil {
		t.Fatalf("DUMP %s: %v", key, err)
	}
	ttl, err := rdb.PTTL(ctx, key).Result()
	if err != nil || ttl <= 0 {
		t.Fatalf("PTTL %s = %v, %v; want a TTL", key, ttl, err)
	}
	if err := rdb.Do(ctx, "RESTORE", key, ttl.Milliseconds(), dump, "REPLACE", "IDLETIME", 1_000_000).Err(); err != nil {
		t.Fatalf("RESTORE %s IDLETIME: %v", key, err)
	}
	value := strings.Repeat("r", 64<<10) // a stored result of 64 KiB
	for n := 1; n <= 500; n++ {
		*bulk++
		if err := rdb.Set(ctx, "result:"+strconv.Itoa(*bulk), value, time.Hour).Err(); err != nil {
			t.Fatalf("SET a bulk value: %v", err)
		}
		if exists, err := rdb.Exists(ctx, key).Result(); err != nil {
			t.Fatal(err)
		} else if exists == 0 {
			return n
		}
	}
	t.Fatalf("Redis kept %s through 500 bulk values of 64 KiB", key)
	return 0
}

// TestRedisEvictionKeepsLimit: Redis, with a few MiB of maxmemory and the policy the
// README advises (volatile-lru; allkeys-lru too), evicts the route's bucket again and
// again while a poller asks for unknown ids far beyond the route's limit; Core still
// gets no more than burst + rate·t polls (and one for the instant the flood ends), and
// mdproxy_limiter_redis_restores_total counts every eviction that found the bucket in
// debt.
func TestRedisEvictionKeepsLimit(t *testing.T) {
	if testing.Short() {
		t.Skip("a flood of some seconds against redis-server")
	}
	for _, policy := range []string{"volatile-lru", "allkeys-lru"} {
		t.Run(policy, func(t *testing.T) {
			srv := redistest.Start(t)
			rdb := srv.Client(t)
			ctx := context.Background()
			info, err := rdb.Info(ctx, "memory").Result()
			if err != nil {
				t.Fatal(err)
			}
			base := infoInt(t, info, "used_memory")
			for k, v := range map[string]string{
				"maxmemory":         strconv.FormatInt(base+2<<20, 10), // 2 MiB for data
				"maxmemory-policy":  policy,
				"maxmemory-samples": "64", // every key sampled: the idlest is the one evicted
			} {
				if err := rdb.ConfigSet(ctx, k, v).Err(); err != nil {
					t.Fatalf("CONFIG SET %s %s: %v", k, v, err)
				}
			}

			var reached atomic.Int64
			core := newLoopback(t, func(w http.ResponseWriter, r *http.Request) {
				reached.Add(1)
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusNotFound) // Core's answer for an unknown id
				io.WriteString(w, `{"err":"Not found"}`)
			})
			const rate, burst = 2, 10 // a debt of up to 5 s: a bucket is in it when evicted
			p := startBinary(t, core.URL, map[string]string{
				"MDPROXY_REDIS_URL":            srv.URL(),
				"MDPROXY_REDIS_TIMEOUT":        "1m", // no decision falls back, however loaded the machine
				"MDPROXY_FILE_RESULT_RATE":     strconv.Itoa(rate),
				"MDPROXY_FILE_RESULT_BURST":    strconv.Itoa(burst),
				"MDPROXY_FILE_RESULT_MAX_WAIT": "0s",
				"MDPROXY_BRIDGE":               "false", // every poll asks for a token
			})
			c := newClient(t)
			poll := func(id string) {
				t.Helper()
				a, err := pollOnce(c, p.proxyURL, id)
				if err != nil {
					t.Fatal(err)
				}
				if a.status != http.StatusNotFound && !(a.status == http.StatusServiceUnavailable && strings.Contains(a.body, "Too many requests")) {
					t.Fatalf("poll: %d %s, want Core's 404 or the limit's 503", a.status, a.body)
				}
			}

			start := time.Now()
			poll("first") // the route's key exists from here on
			key := ""
			if keys, err := rdb.Keys(ctx, "mdproxy:limit:file_result:*").Result(); err != nil || len(keys) != 1 {
				t.Fatalf("KEYS mdproxy:limit:file_result:* = %q, %v; want the route's bucket", keys, err)
			} else {
				key = keys[0]
			}
			const evictions = 12
			bulk, inDebt, polls := 0, 0, 1
			for i := range evictions {
				// 300 polls between evictions: the bucket is drained and in debt.
				for n := range 300 {
					poll(fmt.Sprintf("id-%d-%d", i, n))
					polls++
				}
				v, err := rdb.Get(ctx, key).Result()
				if err != nil {
					t.Fatalf("GET %s: %v", key, err)
				}
				tatText, _, _ := strings.Cut(v, ":")
				tat, err := strconv.ParseInt(tatText, 10, 64)
				if err != nil {
					t.Fatalf("%s = %q, want <tat>:<generation>", key, v)
				}
				evict(t, rdb, key, &bulk)
				poll(fmt.Sprintf("after-%d", i))
				polls++
				// Decided before this instant: if the bucket was still in debt then, the
				// poll restored it.
				if redisTime(t, rdb) < tat {
					inDebt++
				}
			}
			elapsed := time.Since(start).Seconds()

			most := burst + rate*elapsed + 1
			t.Logf("%s: %d polls in %.2f s, %d reached Core (at most %.1f); %d bulk values written, %d evictions of the bucket in debt",
				policy, polls, elapsed, reached.Load(), most, bulk, inDebt)
			if got := float64(reached.Load()); got > most {
				t.Errorf("Core got %v polls in %.2f s, want at most burst %d + %d/s·t + 1 = %.1f", got, elapsed, burst, rate, most)
			}
			if inDebt < evictions/2 {
				t.Fatalf("%d of %d evictions found the bucket in debt, want most: the test did not test", inDebt, evictions)
			}
			restored := p.metric(t, series("mdproxy_limiter_redis_restores_total", "bucket", "route", "route", "file_result"))
			if restored < float64(inDebt) {
				t.Errorf("mdproxy_limiter_redis_restores_total{route=file_result,bucket=route} = %v, want at least the %d evictions in debt", restored, inDebt)
			}
			if got := p.metric(t, series("mdproxy_limiter_mode", "mode", "redis")); got != 1 {
				t.Errorf("mdproxy_limiter_mode{mode=redis} = %v, want 1: every decision shared", got)
			}
			if n := strings.Count(p.logs.String(), "limiter state lost in Redis"); n != 1 {
				t.Errorf("%d log lines of lost state, want 1 (at most one a minute)", n)
			}
			stats, err := rdb.Info(ctx, "stats").Result()
			if err != nil {
				t.Fatal(err)
			}
			if ev := infoInt(t, stats, "evicted_keys"); ev < evictions {
				t.Errorf("Redis's evicted_keys = %d, want at least %d: Redis evicted them itself", ev, evictions)
			}
		})
	}
}

// infoInt returns the integer field name of an INFO answer.
func infoInt(t *testing.T, info, name string) int64 {
	t.Helper()
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatalf("INFO %s = %q", name, v)
			}
			return n
		}
	}
	t.Fatalf("INFO has no %s", name)
	return 0
}
