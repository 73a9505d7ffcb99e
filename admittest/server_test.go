package admittest_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/admitkit/admit/admittest"
	"github.com/valkey-io/valkey-go"
)

// A test that runs the suite on a server of its own, for a repository
// whose CI has valkey-server installed but no server running. It needs no
// Output comment: it starts a server, so go test only compiles it.
func ExampleStartServer() {
	testAdmitConformance := func(t *testing.T) {
		addr, stop, err := admittest.StartServer()
		if errors.Is(err, admittest.ErrNoServer) {
			t.Skip(err)
		}
		if err != nil {
			t.Fatal(err)
		}
		defer stop()
		client, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{addr}})
		if err != nil {
			t.Fatal(err)
		}
		defer client.Close()
		admittest.Run(t, client, admittest.Owned()) // the server is the suite's alone
	}
	_ = testAdmitConformance // func TestAdmitConformance(t *testing.T) in a _test.go file
}

// TestStartServerWithoutBinary checks that with no binary to start both
// starters return ErrNoServer, and nothing to stop.
func TestStartServerWithoutBinary(t *testing.T) {
	t.Setenv("VALKEY_SERVER", "")
	t.Setenv("PATH", t.TempDir())
	addr, stop, err := admittest.StartServer()
	if !errors.Is(err, admittest.ErrNoServer) || addr != "" || stop != nil {
		t.Errorf("StartServer() = %q, stop != nil: %v, %v; want ErrNoServer", addr, stop != nil, err)
	}
	addrs, stop, err := admittest.StartCluster(3)
	if !errors.Is(err, admittest.ErrNoServer) || addrs != nil || stop != nil {
		t.Errorf("StartCluster(3) = %q, stop != nil: %v, %v; want ErrNoServer", addrs, stop != nil, err)
	}
}

// TestStartClusterRefusesNoPrimaries checks that StartCluster refuses a
// cluster without primaries, naming the count, before it looks for a
// binary.
func TestStartClusterRefusesNoPrimaries(t *testing.T) {
	t.Setenv("VALKEY_SERVER", "/nonexistent/valkey-server")
	for _, n := range []int{0, -1} {
		addrs, stop, err := admittest.StartCluster(n)
		if err == nil || errors.Is(err, admittest.ErrNoServer) || addrs != nil || stop != nil {
			t.Errorf("StartCluster(%d) = %q, stop != nil: %v, %v; want an error about the primaries", n, addrs, stop != nil, err)
			continue
		}
		if !strings.Contains(err.Error(), "at least 1 primary") {
			t.Errorf("StartCluster(%d): %v; want it to say a cluster needs at least 1 primary", n, err)
		}
	}
}
