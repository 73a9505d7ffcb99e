package mgmt

import (
	"strings"
	"testing"
	"time"

	"github.com/admitkit/admit/examples/outgress/internal/testenv"
)

// runCLI runs `outgress mgmt args...` against the fleet on subjects, on
// the test's NATS server.
func runCLI(t *testing.T, subj string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	t.Setenv("NATS_URL", testenv.NATSURL(t))
	var out, errOut strings.Builder
	code = run(append([]string{"-subjects", subj}, args...), &out, &errOut)
	return code, out.String(), errOut.String()
}

// cliFleet starts two replicas answering management requests on subjects
// of the test's own.
func cliFleet(t *testing.T) (subj string, a *replica) {
	t.Helper()
	srv := testenv.Shared(t)
	prefix := testenv.Prefix(t)
	subj = subjects()
	cfg := Config{Prefix: subj + ".mgmt"}
	a = startReplica(t, srv, prefix, "A", cfg, time.Hour, false)
	startReplica(t, srv, prefix, "B", cfg, time.Hour, false)
	return subj, a
}

func stored(t *testing.T, r *replica) (bool, int64) {
	t.Helper()
	paused, v, err := r.pause.Stored(testenv.Ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	return paused, v
}

// TestCommandNeedsTheVersionSeen: `mgmt pause` without -version writes
// nothing: it prints the state and its version, asks for the version
// (naming the command to run) and exits 2. With the version seen it
// pauses (exit 0); a second operator's resume made against the version
// it saw before the pause (0) is refused (exit 1, conflict named) and
// writes nothing.
func TestCommandNeedsTheVersionSeen(t *testing.T) {
	subj, a := cliFleet(t)
	code, out, errOut := runCLI(t, subj, "pause")
	if code != 2 || !strings.Contains(out, "Valkey: paused false, version 0") ||
		!strings.Contains(errOut, "pause needs -version") || !strings.Contains(errOut, "run: outgress mgmt -version 0 pause") {
		t.Errorf("pause without -version: exit %d, stdout %q, stderr %q; want 2, the state at version 0, and the command to run", code, out, errOut)
	}
	if paused, v := stored(t, a); paused || v != 0 {
		t.Fatalf("after the pause without -version: paused %v at version %d, want nothing written", paused, v)
	}
	code, out, errOut = runCLI(t, subj, "-version", "0", "pause")
	if code != 0 || !strings.Contains(out, "version 1 (the edit was made against version 0)") {
		t.Errorf("pause -version 0: exit %d, stdout %q, stderr %q; want 0, version 1", code, out, errOut)
	}
	code, out, errOut = runCLI(t, subj, "-version", "0", "resume") // the other operator's stale view
	if code != 1 || !strings.Contains(errOut, "made against version 0, Valkey holds version 1 (paused)") || out != "" {
		t.Errorf("resume -version 0 after the pause: exit %d, stdout %q, stderr %q; want 1 and the conflict", code, out, errOut)
	}
	if paused, v := stored(t, a); !paused || v != 1 {
		t.Errorf("after the stale resume: paused %v at version %d, want still paused at 1", paused, v)
	}
	code, out, errOut = runCLI(t, subj, "-for", "10m", "pause")
	if code != 2 || !strings.Contains(errOut, "run: outgress mgmt -version 1 -for 10m0s pause") {
		t.Errorf("pause -for 10m without -version: exit %d, stdout %q, stderr %q; want 2 and the command to run", code, out, errOut)
	}
	code, out, _ = runCLI(t, subj, "status")
	if code != 0 || !strings.Contains(out, "Valkey: paused true, version 1") {
		t.Errorf("status: exit %d, %q; want 0, paused at version 1", code, out)
	}
}

// TestCommandRefusesBadTimedPause: -for past pause.MaxPauseFor, or given
// to resume, is bad usage (exit 2), and nothing is written.
func TestCommandRefusesBadTimedPause(t *testing.T) {
	subj, a := cliFleet(t)
	for _, args := range [][]string{
		{"-version", "0", "-for", "24h0m1s", "pause"},
		{"-version", "0", "-for", "10m", "resume"},
		{"-version", "0", "-for", "-1m", "pause"},
		{"-version", "0", "halt"},
	} {
		if code, out, errOut := runCLI(t, subj, args...); code != 2 || errOut == "" {
			t.Errorf("mgmt %q: exit %d, stdout %q, stderr %q; want 2 and the reason", args, code, out, errOut)
		}
	}
	if paused, v := stored(t, a); paused || v != 0 {
		t.Errorf("paused %v at version %d, want nothing written", paused, v)
	}
	if code, out, errOut := runCLI(t, subj, "-version", "0", "-for", "24h", "pause"); code != 0 || !strings.Contains(out, "version 1") {
		t.Errorf("pause -for 24h: exit %d, stdout %q, stderr %q; want 0, version 1", code, out, errOut)
	}
}
