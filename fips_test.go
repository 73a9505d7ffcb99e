package admit

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/admitkit/admit/internal/testserver"
)

// TestFIPSOnly runs this test binary again under GODEBUG=fips140=only, where
// SHA-1 panics: importing admit must not kill the program, and decisions
// must work, with valkey-go loading the script's SHA-1 from the server.
// (Before the fix the child died at package init, before any test ran.)
func TestFIPSOnly(t *testing.T) {
	if os.Getenv("ADMIT_FIPS_CHILD") == "1" {
		fipsChild(t)
		return
	}
	srv := testserver.Shared(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestFIPSOnly$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), "GODEBUG=fips140=only", "ADMIT_FIPS_CHILD=1", "VALKEY_ADDR="+srv.Addr)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "fips-only decisions: allowed, allowed, denied by bucket 1") {
		t.Fatalf("child under GODEBUG=fips140=only: %v\n%s", err, out)
	}
}

func fipsChild(t *testing.T) {
	spec := MustSpec(Every(time.Hour), 2)
	srv := testserver.Shared(t)
	c := testserver.NewClient(t, srv)
	l := New(c)
	key := testserver.Prefix(t, c) + "fips"
	var got []string
	for range 3 {
		d, err := l.AllowOrdered(context.Background(), Request{Key: key, Spec: spec}, nil)
		if err != nil {
			t.Fatalf("decision under fips140=only: %v", err)
		}
		got = append(got, d.String())
	}
	t.Logf("fips-only decisions: %s", strings.Join(got, ", "))
}
