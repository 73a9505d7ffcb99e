package testserver

import (
	"os"
	"testing"
)

// tally appends "<outcome>\t<package dir>\t<test>" to the file named by
// ADMIT_SERVER_TALLY, when it is set: outcome "ran" when a test got a real
// server, "skipped" when it skipped for want of one. scripts/test.sh (make
// test) sets it per module and prints how many real-server tests ran and
// how many skipped, since go test prints only "ok" for a package whose
// real-server tests all skipped. A tally that cannot be written is dropped:
// it is a report, never a reason to fail a test.
func tally(tb testing.TB, outcome string) {
	path := os.Getenv("ADMIT_SERVER_TALLY")
	if path == "" {
		return
	}
	dir, _ := os.Getwd() // go test runs each package's tests in its directory
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		return
	}
	defer f.Close()
	// One write per line, so that the appends of the test binaries go
	// test runs at once do not interleave; tabs, since a path may hold
	// spaces.
	_, _ = f.WriteString(outcome + "\t" + dir + "\t" + tb.Name() + "\n")
}
