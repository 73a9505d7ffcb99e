package admittest_test

import (
	"os"
	"testing"

	"github.com/admitkit/admit/admittest"
	"github.com/valkey-io/valkey-go"
)

// A test in your own repository that runs the suite against your server
// through a client built as your services build theirs. It needs no
// Output comment: it dials a server, so go test only compiles it.
func ExampleRun() {
	testAdmitConformance := func(t *testing.T) {
		addr := os.Getenv("VALKEY_ADDR")
		if addr == "" {
			t.Skip("set VALKEY_ADDR=host:port")
		}
		opt := valkey.ClientOption{
			InitAddress: []string{addr},
			Username:    os.Getenv("VALKEY_USER"),
			Password:    os.Getenv("VALKEY_PASSWORD"),
		}
		// A least-privilege user of admit's cannot prepare or inspect the
		// suite's keys: give a client of another user with WithAdmin, and
		// the prefix the limiter user may write with WithPrefix.
		client, err := valkey.NewClient(opt)
		if err != nil {
			t.Fatal(err)
		}
		defer client.Close()
		admittest.Run(t, client, admittest.WithClientOption(opt))
	}
	_ = testAdmitConformance // func TestAdmitConformance(t *testing.T) in a _test.go file
}
