package main

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestRelayUpload sends uploads through both TCP relays to a stand-in on loopback: each
// must arrive whole, with the stand-in's answer relayed back, and the relay must stop
// with no goroutine left once its listener is closed.
func TestRelayUpload(t *testing.T) {
	for _, splice := range []bool{false, true} {
		t.Run(map[bool]string{false: "copy", true: "splice"}[splice], func(t *testing.T) {
			defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
			st := httptest.NewServer(newStandin())
			defer st.Close()
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- serveRelay(ln, st.Listener.Addr().String(), splice) }()

			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			const size = 24<<20 + 123 // not a multiple of any buffer
			for range 3 {
				code, err := upload(ctx, "http://"+ln.Addr().String()+"/file", size)
				if err != nil || code != http.StatusOK {
					t.Fatalf("upload through the relay: status %d, %v; want 200", code, err)
				}
			}
			resp, err := http.Get(st.URL + statsPath)
			if err != nil {
				t.Fatal(err)
			}
			var got standinStats
			err = json.NewDecoder(resp.Body).Decode(&got)
			resp.Body.Close()
			if err != nil {
				t.Fatal(err)
			}
			if got.UploadsComplete != 3 || got.UploadsIncomplete != 0 || got.UploadBytes != 3*size {
				t.Errorf("stand-in: %d whole, %d not, %d bytes; want 3 whole of %d bytes", got.UploadsComplete, got.UploadsIncomplete, got.UploadBytes, size)
			}

			_ = ln.Close()
			select {
			case err := <-done:
				if !errors.Is(err, net.ErrClosed) {
					t.Errorf("serveRelay returned %v, want net.ErrClosed", err)
				}
			case <-ctx.Done():
				t.Fatal("serveRelay did not return after its listener closed")
			}
		})
	}
}

// TestRelayUpstreamReset: when the upstream resets its connection, the relay closes the
// client's too, even from a client that keeps it open and sends nothing, so that the
// relay's connections end and it stops once its listener is closed.
func TestRelayUpstreamReset(t *testing.T) {
	for _, splice := range []bool{false, true} {
		t.Run(map[bool]string{false: "copy", true: "splice"}[splice], func(t *testing.T) {
			defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
			up, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer up.Close()
			go func() {
				c, err := up.Accept()
				if err != nil {
					return
				}
				_ = c.(*net.TCPConn).SetLinger(0) // Close sends RST
				_ = c.Close()
			}()
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- serveRelay(ln, up.Addr().String(), splice) }()

			c, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
			if n, err := c.Read(make([]byte, 1)); n != 0 || err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("client read after the upstream's reset: %d bytes, %v; want the connection ended", n, err)
			}
			// The client still holds its connection open: the relay must not wait on it.
			_ = ln.Close()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("serveRelay still waits on a connection whose upstream was reset")
			}
		})
	}
}
