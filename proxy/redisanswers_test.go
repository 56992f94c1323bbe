package proxy

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/mdproxy/mdproxy/bridge"
	"github.com/mdproxy/mdproxy/internal/redistest"
)

// TestRedisStoredAnswersBounded: with the results in Redis, slow clients polling a
// large stored result hold no more than the answer budget the proxy shares with the
// store, however many they are. Through a real redis-server: the first two get a copy of
// the stored result each, charged to the budget while they read; the budget then cannot
// take another copy, so the next polls ask Core (the submitter's own result: never a
// 503), whose answer goes to each as it comes, within what is left of the budget. Once
// the slow clients have gone, the budget is free again and a poll is answered from
// Redis.
func TestRedisStoredAnswersBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("moves about 100 MiB through loopback")
	}
	// Larger than what the sockets between a client that reads nothing and the proxy
	// hold (its receive buffer, about 128 KiB, and the proxy's send buffer, at most
	// 4 MiB): its answer stays in the proxy's memory.
	const size = 8 << 20
	srv := redistest.Start(t)
	answers := bridge.NewBudget(2*size + 2<<20)
	store, err := bridge.NewRedisStore(srv.Client(t), bridge.RedisStoreOptions{TTL: time.Hour, PendingTTL: time.Hour,
		Timeout: 5 * time.Second, MaxBytes: 1 << 30, Answers: answers})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(store.Close)
	b, err := bridge.New(bridge.Options{CallbackURL: "http://127.0.0.1:9", Store: store})
	if err != nil {
		t.Fatal(err)
	}
	want := paddedResult("big", size)
	store.Put("big", bridge.Result{Body: want, ContentType: "application/json", Owner: bridge.OwnerOf("alice")})
	core := &bigResultCore{size: size, asked: map[string]int{}}
	front, _ := newTestProxy(t, core, func(o *Options) {
		o.Bridge = b
		o.PollBuffers = answers
	})
	u, _ := url.Parse(front)

	// Slow clients, each polling with a cache-buster of its own (answered from the
	// store as the plain poll, and asking Core a question of its own): each reads the
	// status line only.
	const slow = 6
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := range slow {
		c, err := net.Dial("tcp", u.Host)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		if _, err := io.WriteString(c, "GET /file/big?n="+string(rune('a'+i))+" HTTP/1.1\r\nHost: x\r\napikey: alice\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		line, err := bufio.NewReaderSize(c, 64).ReadString('\n')
		if err != nil || !strings.HasPrefix(line, "HTTP/1.1 200") {
			t.Fatalf("slow client %d's status line = %q, %v; want 200", i+1, line, err)
		}
		if held := answers.Held(); held > answers.Max() || (i >= 1 && held < 2*size) {
			t.Fatalf("with %d slow clients the answer budget holds %d bytes, want the two copies (%d) and at most the budget (%d)",
				i+1, held, 2*size, answers.Max())
		}
	}
	if n := core.polls("big"); n != slow-2 {
		t.Errorf("Core was asked %d times for %d slow polls, want %d: two copies fit the budget, the others ask Core", n, slow, slow-2)
	}

	// A client that reads: Core's whole answer, as it came, since the budget is full.
	c := newClient(t)
	resp, got := do(t, c, http.MethodGet, front+"/file/big", http.Header{"Apikey": {"alice"}})
	if resp.StatusCode != http.StatusOK || got != string(want) {
		t.Fatalf("poll with the budget full = %d, %d bytes; want 200 with the result's %d bytes", resp.StatusCode, len(got), len(want))
	}
	if n := core.polls("big"); n != slow-1 {
		t.Errorf("Core asked %d times after the reading client's poll, want %d", n, slow-1)
	}

	// The slow clients leave: every byte goes back to the budget, and a poll is
	// answered from Redis again.
	for _, c := range conns {
		c.Close()
	}
	deadline := time.Now().Add(20 * time.Second)
	for answers.Held() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the answer budget still holds %d bytes 20 s after the slow clients left, want 0", answers.Held())
		}
		time.Sleep(10 * time.Millisecond)
	}
	resp, got = do(t, c, http.MethodGet, front+"/file/big", http.Header{"Apikey": {"alice"}})
	if resp.StatusCode != http.StatusOK || got != string(want) || core.polls("big") != slow-1 {
		t.Errorf("poll once the budget is free = %d, %d bytes, Core asked %d times; want 200 from the store, Core still asked %d times",
			resp.StatusCode, len(got), core.polls("big"), slow-1)
	}
	if held := answers.Held(); held != 0 {
		t.Errorf("the budget holds %d bytes once the poll was answered, want 0", held)
	}
}
