package admit

import "testing"

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
