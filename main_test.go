package admit

import (
	"os"
	"testing"

	"github.com/admitkit/admit/internal/testserver"
)

// TestMain stops the shared test server after the last test.
func TestMain(m *testing.M) {
	code := m.Run()
	testserver.StopShared()
	os.Exit(code)
}
