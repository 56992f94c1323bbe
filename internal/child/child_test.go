package child

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The tests run this test binary as the child: with CHILD_TEST_MODE set, TestMain
// behaves as the mode says instead of running tests.
func TestMain(m *testing.M) {
	switch os.Getenv("CHILD_TEST_MODE") {
	case "":
		os.Exit(m.Run())
	case "serve":
		// Logs a line, then the ready line, then serves until SIGTERM, then logs a
		// last line without its newline and exits 0.
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGTERM)
		fmt.Fprintln(os.Stderr, `{"msg":"starting"}`)
		fmt.Fprintln(os.Stdout, `{"msg":"child serving","listen":"127.0.0.1:1"}`)
		<-sig
		fmt.Fprint(os.Stderr, `{"msg":"stopped"}`)
		os.Exit(0)
	case "exit3":
		fmt.Fprintln(os.Stderr, "bad setting")
		os.Exit(3)
	case "deaf":
		signal.Ignore(syscall.SIGTERM)
		fmt.Fprintln(os.Stderr, `{"msg":"child serving"}`)
		time.Sleep(time.Hour)
	}
}

// syncBuffer is a bytes.Buffer safe for concurrent use.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestStartReadyAndStop(t *testing.T) {
	var log syncBuffer
	p, err := Start(context.Background(), os.Args[0], Options{
		Env: []string{"CHILD_TEST_MODE=serve"}, Ready: "child serving", Log: &log,
	})
	if err != nil {
		t.Fatalf("Start = %v", err)
	}
	if got := p.Field("listen"); got != "127.0.0.1:1" {
		t.Errorf("Field(listen) = %q, want 127.0.0.1:1", got)
	}
	if p.Exited() {
		t.Errorf("Exited() = true before Stop, want false")
	}
	if err := p.Stop(time.Minute); err != nil {
		t.Errorf("Stop = %v, want nil (exit status 0 after SIGTERM)", err)
	}
	if err := p.Stop(time.Minute); err != nil {
		t.Errorf("second Stop = %v, want nil", err)
	}
	if p.ExitCode() != 0 {
		t.Errorf("ExitCode() = %d, want 0", p.ExitCode())
	}
	// Every line passed on whole, the last one without its newline as written.
	for _, want := range []string{"{\"msg\":\"starting\"}\n", "{\"msg\":\"child serving\",\"listen\":\"127.0.0.1:1\"}\n"} {
		if !strings.Contains(log.String(), want) {
			t.Errorf("log = %q, want it to contain %q", log.String(), want)
		}
	}
	if !strings.HasSuffix(log.String(), `{"msg":"stopped"}`) {
		t.Errorf("log = %q, want it to end with the last line, unterminated", log.String())
	}
}

func TestStartExitsBeforeReady(t *testing.T) {
	_, err := Start(context.Background(), os.Args[0], Options{
		Env: []string{"CHILD_TEST_MODE=exit3"}, Ready: "child serving",
	})
	if err == nil || !strings.Contains(err.Error(), "exit status 3") || !strings.Contains(err.Error(), "bad setting") {
		t.Errorf("Start of a child that exits = %v, want an error with its exit status and last line", err)
	}
}

func TestStopKillsAfterGrace(t *testing.T) {
	p, err := Start(context.Background(), os.Args[0], Options{
		Env: []string{"CHILD_TEST_MODE=deaf"}, Ready: "child serving",
	})
	if err != nil {
		t.Fatalf("Start = %v", err)
	}
	if err := p.Stop(10 * time.Millisecond); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Errorf("Stop of a child ignoring SIGTERM = %v, want it killed", err)
	}
}

func TestStartContextEnded(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := Start(ctx, os.Args[0], Options{Env: []string{"CHILD_TEST_MODE=serve"}, Ready: "never logged"})
	if err != context.Canceled {
		t.Errorf("Start with an ended context = %v, want context.Canceled", err)
	}
}

func TestLineWriter(t *testing.T) {
	var out bytes.Buffer
	ready := make(chan map[string]any, 1)
	w := &lineWriter{ready: "up", out: &out, readyc: ready}
	for _, part := range []string{`{"msg":"u`, `p","admin":"a"}` + "\nsecond\nthi", "rd"} {
		if _, err := w.Write([]byte(part)); err != nil {
			t.Fatal(err)
		}
	}
	w.flush()
	if got, want := out.String(), "{\"msg\":\"up\",\"admin\":\"a\"}\nsecond\nthird"; got != want {
		t.Errorf("lines passed on = %q, want %q", got, want)
	}
	select {
	case rec := <-ready:
		if rec["admin"] != "a" {
			t.Errorf("ready line fields = %v, want admin a", rec)
		}
	default:
		t.Errorf("no ready line handed over")
	}
	if got := w.tail(); got != "{\"msg\":\"up\",\"admin\":\"a\"}\nsecond" {
		t.Errorf("tail() = %q", got)
	}
}
