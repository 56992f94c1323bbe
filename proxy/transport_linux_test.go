package proxy

import (
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/mdproxy/mdproxy/internal/netx"
)

// TestCoreSendBuffer: each connection to Core asks for a send buffer of netx.SendBuffer
// bytes (capped by net.core.wmem_max; Linux reports twice what it grants), where the
// kernel's default would start at 16 KiB and hold an upload's writes back.
func TestCoreSendBuffer(t *testing.T) {
	t.Parallel()
	core := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer core.Close()
	tr := NewTransport(TransportOptions{})
	defer tr.CloseIdleConnections()
	_, conn, err := roundTripConn(t, tr, core.URL+"/file/x")
	if err != nil {
		t.Fatal(err)
	}

	cc := coreConnOf(conn)
	if cc == nil {
		t.Fatalf("connection to Core = %T, want a *coreConn", conn)
	}
	got, err := sockopt(cc.Conn.(*net.TCPConn), syscall.SOL_SOCKET, syscall.SO_SNDBUF)
	if err != nil {
		t.Fatalf("getsockopt SO_SNDBUF: %v", err)
	}
	want := netx.SendBuffer
	if b, err := os.ReadFile("/proc/sys/net/core/wmem_max"); err == nil {
		if max, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && max < want {
			want = max
		}
	}
	if got < 2*want {
		t.Errorf("SO_SNDBUF of the connection to Core = %d bytes, want %d (twice the %d asked for, as Linux reports it)", got, 2*want, want)
	}
}

// sockopt returns the integer option opt of level (SOL_SOCKET's SO_SNDBUF...) of c's socket.
func sockopt(c *net.TCPConn, level, opt int) (int, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	var got int
	var serr error
	if err := raw.Control(func(fd uintptr) { got, serr = syscall.GetsockoptInt(int(fd), level, opt) }); err != nil {
		return 0, err
	}
	return got, serr
}
