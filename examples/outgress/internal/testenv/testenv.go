// Package testenv holds the helpers the outgress packages' tests share: a
// bounded context, a bounded wait, a free port, a command-name check, the
// NATS server the tests use (NATS_URL, else one embedded server per test
// binary), the pause events' subject of a test's fleet, and the Valkey
// servers they run on (valkey.go).
package testenv

import (
	"context"
	"fmt"
	"hash/fnv"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/admitkit/admit/examples/outgress/bus"
	"github.com/nats-io/nats.go"
	"github.com/valkey-io/valkey-go"
)

// Ctx is a context that ends with the test, bounded at 30 s.
func Ctx(tb testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	tb.Cleanup(cancel)
	return ctx
}

// WaitFor polls cond every millisecond for at most 5 s and reports whether
// it became true.
func WaitFor(cond func() bool) bool {
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if cond() {
			return true
		}
	}
	return cond()
}

// FreePort is a TCP port free on 127.0.0.1 when asked.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// IsCommand reports whether cmd's name is name (case-insensitive).
func IsCommand(cmd valkey.Completed, name string) bool {
	parts := cmd.Commands()
	return len(parts) > 0 && strings.EqualFold(parts[0], name)
}

var embedded struct {
	once sync.Once
	e    *bus.Embedded
	err  error
}

// NATSURL is NATS_URL, else the URL of an embedded server started by the
// first caller and stopped by Stop.
func NATSURL(tb testing.TB) string {
	tb.Helper()
	if u := os.Getenv("NATS_URL"); u != "" {
		return u
	}
	embedded.once.Do(func() { embedded.e, embedded.err = bus.StartEmbedded() })
	if embedded.err != nil {
		tb.Fatal(embedded.err)
	}
	return embedded.e.URL()
}

// Main runs a test binary's tests, then stops the servers they shared
// (Stop): a package's TestMain is testenv.Main(m).
func Main(m *testing.M) {
	code := m.Run()
	Stop()
	os.Exit(code)
}

// stopNATS stops the embedded server, if one was started; Stop calls it.
func stopNATS() {
	if embedded.e != nil {
		embedded.e.Close()
	}
}

// NATSConn is a core NATS connection to NATSURL, closed with the test.
func NATSConn(tb testing.TB) *nats.Conn {
	tb.Helper()
	nc, err := nats.Connect(NATSURL(tb), nats.Name(tb.Name()))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(nc.Close)
	return nc
}

// PauseSubject is the pause events' NATS subject of the replicas that
// share the key prefix prefix: each test's fleet its own subject, the
// same for every replica of it.
func PauseSubject(prefix string) string {
	h := fnv.New64a()
	h.Write([]byte(prefix))
	return fmt.Sprintf("outgress-test.%x.pause", h.Sum64())
}
