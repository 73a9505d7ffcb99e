package admit_test

// This repository's runner of the conformance suite (package admittest):
// every rule of the design, checked on a real server, standalone or
// cluster. Run it against your own deployment with
//
//	VALKEY_ADDR=host:port go test github.com/admitkit/admit -run Conformance -v
//
// (see internal/testserver for the other ways to name a server), or call
// admittest.Run from your own tests with your own client.

import (
	"strings"
	"testing"

	"github.com/admitkit/admit/admittest"
	"github.com/admitkit/admit/internal/testserver"
	"github.com/valkey-io/valkey-go"
)

// TestConformance runs admittest against the deployment that
// testserver.Deployment selects.
func TestConformance(t *testing.T) {
	c, opts := openTarget(t)
	admittest.Run(t, c, opts...)
}

// openTarget connects to the target of testserver.Deployment and returns
// the client and the admittest options that describe it: Owned when the
// tests started the server, or VALKEY_ALLOW_DESTRUCTIVE=1 says it is the
// suite's alone.
func openTarget(t *testing.T) (valkey.Client, []admittest.Option) {
	t.Helper()
	target := testserver.Deployment(t)
	opt := valkey.ClientOption{InitAddress: target.Addrs, DisableCache: true}
	c, err := valkey.NewClient(opt)
	if err != nil {
		t.Fatalf("dial %s: %v", strings.Join(target.Addrs, ","), err)
	}
	t.Cleanup(c.Close)
	if got := c.Mode() == valkey.ClientModeCluster; got != target.Cluster {
		t.Fatalf("%s: client cluster mode %v, want %v", target.Name, got, target.Cluster)
	}
	opts := []admittest.Option{admittest.WithClientOption(opt)}
	mode := "not the suite's alone: no SCRIPT FLUSH and no server command counts; VALKEY_ALLOW_DESTRUCTIVE=1 if it is"
	if target.Destructive() {
		opts = append(opts, admittest.Owned())
		mode = "the suite's alone"
	}
	t.Logf("target: %s; %s", target.Name, mode)
	return c, opts
}
