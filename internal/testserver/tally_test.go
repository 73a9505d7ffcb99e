package testserver

import (
	"os"
	"path/filepath"
	"testing"
)

// TestTally: with ADMIT_SERVER_TALLY set, a test that gets a server adds
// one "ran" line and a test skipped for want of one a "skipped" line,
// naming the package's directory and the test; unset, nothing is written.
func TestTally(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tally")
	t.Setenv("ADMIT_REQUIRE_SERVER", "") // SkipOrFail skips, not fails
	t.Setenv("ADMIT_SERVER_TALLY", path)
	t.Run("ran", func(t *testing.T) { tally(t, "ran") })
	t.Run("skipped", func(t *testing.T) { SkipOrFail(t, "no server") })
	t.Setenv("ADMIT_SERVER_TALLY", "")
	t.Run("untallied", func(t *testing.T) { tally(t, "ran") })

	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	want := "ran\t" + dir + "\tTestTally/ran\nskipped\t" + dir + "\tTestTally/skipped\n"
	if string(got) != want {
		t.Errorf("tally file:\n%q\nwant\n%q", got, want)
	}
}
