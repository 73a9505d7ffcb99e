package admit

import (
	"context"
	"fmt"
	"testing"

	"github.com/admitkit/admit/internal/testserver"
	"github.com/valkey-io/valkey-go"
)

// Reference values from the cluster specification; the integration test
// checks thousands more against a real server's CLUSTER KEYSLOT.
func TestKeySlot(t *testing.T) {
	if got := crc16("123456789"); got != 0x31C3 {
		t.Errorf("crc16(123456789) = %#x, want 0x31c3", got)
	}
	for key, want := range map[string]uint16{
		"foo":                  12182,
		"somekey":              11058,
		"foo{hash_tag}":        2515,
		"bar{hash_tag}":        2515,
		"{user1000}.following": keySlot("user1000"),
		"{user1000}.followers": keySlot("user1000"),
		"foo{}{bar}":           crc16("foo{}{bar}") & 16383, // empty tag: the whole key
		"foo{{bar}}zap":        keySlot("{bar"),             // tag from the first { to the first }
		"foo{bar}{zap}":        keySlot("bar"),
		"{bar":                 crc16("{bar") & 16383,
	} {
		if got := keySlot(key); got != want {
			t.Errorf("keySlot(%q) = %d, want %d", key, got, want)
		}
	}
}

// TestIntegrationKeySlotMatchesServer: keySlot agrees with the server's CLUSTER
// KEYSLOT on thousands of keys, hash tags and odd bytes included, on a
// cluster-enabled server the test starts. It is a real-server test kept
// beside keySlot because it needs keySlot itself, which the public API
// shows only as a cross-slot refusal.
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
