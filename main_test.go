package admit

import (
	"os"
	"testing"
)

// TestMain stops the package's shared server after the last test.
func TestMain(m *testing.M) {
	code := m.Run()
	if shared.srv != nil {
		shared.srv.stop()
	}
	os.Exit(code)
}
