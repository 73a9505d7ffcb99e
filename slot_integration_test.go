package admit

import (
	"context"
	"fmt"
	"testing"

	"github.com/admitkit/admit/internal/testserver"
	"github.com/valkey-io/valkey-go"
)

// TestIntegrationKeySlotMatchesServer: keySlot agrees with the server's CLUSTER
// KEYSLOT on thousands of keys, hash tags and odd bytes included, on a
// cluster-enabled server the test starts.
func TestIntegrationKeySlotMatchesServer(t *testing.T) {
	srv := testserver.Own(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf")
	c, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{srv.Addr}, DisableCache: true, ForceSingleClient: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	keys := []string{"", "{", "}", "{}", "{}x", "a{}{b}", "foo{{bar}}zap", "{user1000}.following", "x{y", "é{ü}"}
	for i := range 3000 {
		keys = append(keys, fmt.Sprintf("rl:{chan:%d}:standard", i), fmt.Sprintf("k%d\xff%d", i, i*7919))
	}
	cmds := make(valkey.Commands, len(keys))
	for i, k := range keys {
		cmds[i] = c.B().Arbitrary("CLUSTER", "KEYSLOT").Args(k).Build()
	}
	for i, r := range c.DoMulti(context.Background(), cmds...) {
		want, err := r.AsInt64()
		if err != nil {
			t.Fatalf("CLUSTER KEYSLOT %q: %v", keys[i], err)
		}
		if got := keySlot(keys[i]); int64(got) != want {
			t.Errorf("keySlot(%q) = %d, server says %d", keys[i], got, want)
		}
	}
}
