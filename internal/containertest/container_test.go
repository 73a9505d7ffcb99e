package containertest

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/internal/testserver"
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

// image returns VALKEY_IMAGE, and skips the test when it is unset: the
// container run is opt-in, whatever ADMIT_REQUIRE_SERVER says, as the root
// module's tests cover the servers on the machine.
func image(t *testing.T) string {
	t.Helper()
	img := os.Getenv("VALKEY_IMAGE")
	if img == "" {
		t.Skip("set VALKEY_IMAGE=valkey/valkey:8.0 (or any Valkey or Redis image) where a Docker engine runs")
	}
	return img
}

func TestContainerTransitions(t *testing.T) {
	image(t)
	srv := testserver.Shared(t)
	c := testserver.NewClient(t, srv)
	p := testserver.Prefix(t, c)
	l := admit.New(c)
	ctx := context.Background()
	std, shared := admit.Request{Key: p + "std", Spec: admit.MustSpec(admit.Every(time.Hour), 1)}, admit.Request{Key: p + "shared", Spec: admit.MustSpec(admit.Every(time.Hour), 5)}
	for i, want := range []uint8{0, 1} {
		if d, err := l.AllowOrdered(ctx, std, &shared); err != nil || d.Denied != want {
			t.Errorf("call %d on %s: %v, %v; want Denied %d", i, srv.Version, d, err, want)
		}
	}
}
