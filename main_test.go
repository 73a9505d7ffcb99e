package admit

import (
	"os"
	"testing"

	"github.com/admitkit/admit/internal/testserver"
)

// TestMain stops the shared test server after the last test. Under
// ADMIT_TEST_SCRIPT=path (set only by TestTrustMutants for a child test
// binary) every Limiter runs the script at path instead of script.lua.
func TestMain(m *testing.M) {
	if path := os.Getenv("ADMIT_TEST_SCRIPT"); path != "" {
		src, err := os.ReadFile(path)
		if err != nil {
			panic(err)
		}
		scriptSource = string(src)
	}
	code := m.Run()
	testserver.StopShared()
	os.Exit(code)
}
