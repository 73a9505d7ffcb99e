package containertest

import (
	"context"
	"os"
	"testing"

	"github.com/admitkit/admit/admittest"
	"github.com/admitkit/admit/internal/testserver"
	"github.com/valkey-io/valkey-go"
)

// TestMain lets testserver start VALKEY_IMAGE through Start, and removes the
// container after the last test.
func TestMain(m *testing.M) {
	testserver.StartImage = func(ctx context.Context, image string) (string, func(), error) {
		return Start(ctx, image)
	}
	code := m.Run()
	testserver.StopShared()
	os.Exit(code)
}

// TestConformance runs admit's conformance suite on a server in a container
// of VALKEY_IMAGE. It skips when VALKEY_IMAGE is unset, whatever
// ADMIT_REQUIRE_SERVER says: the root module's tests cover the servers on
// the machine, and this run is for where a Docker engine is.
func TestConformance(t *testing.T) {
	if os.Getenv("VALKEY_IMAGE") == "" {
		t.Skip("set VALKEY_IMAGE=valkey/valkey:8.0 (or any Valkey or Redis image) where a Docker engine runs")
	}
	srv := testserver.Shared(t)
	opt := valkey.ClientOption{InitAddress: []string{srv.Addr}, DisableCache: true}
	c, err := valkey.NewClient(opt)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	t.Logf("VALKEY_IMAGE=%s: %s at %s", os.Getenv("VALKEY_IMAGE"), srv.Version, srv.Addr)
	admittest.Run(t, c, admittest.WithClientOption(opt), admittest.Owned())
}
