package admit

import (
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
)

// TestOnceKeyBounds: onceKey refuses an empty id, one over MaxOnceIDLen
// and a key whose record could not share its slot, with ErrInvalidRequest.
func TestOnceKeyBounds(t *testing.T) {
	for _, tc := range []struct {
		key, id string
		ok      bool
	}{
		{"k", "", false},
		{"k", strings.Repeat("x", MaxOnceIDLen+1), false},
		{"k", strings.Repeat("x", MaxOnceIDLen), true},
		{"a}b", "id", false},
		{"a{t}b", "id", true},
		{"", "id", false},
	} {
		_, err := onceKey(tc.key, tc.id)
		if tc.ok && err != nil || !tc.ok && !errors.Is(err, ErrInvalidRequest) {
			t.Errorf("onceKey(%q, %d-byte id) = %v; want ok %v", tc.key, len(tc.id), err, tc.ok)
		}
	}
}

// TestOnceKeySlot: the record always hashes to its first key's slot.
func TestOnceKeySlot(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	alphabet := "ab{}:x"
	for range 50_000 {
		b := make([]byte, 1+rng.IntN(8))
		for i := range b {
			b[i] = alphabet[rng.IntN(len(alphabet))]
		}
		key := string(b)
		rec, err := onceKey(key, "id{}")
		if err != nil {
			if hasHashTag(key) || !strings.Contains(key, "}") {
				t.Fatalf("onceKey(%q) refused: %v", key, err)
			}
			continue
		}
		if keySlot(rec) != keySlot(key) {
			t.Fatalf("record %q is in slot %d, its key %q in %d", rec, keySlot(rec), key, keySlot(key))
		}
	}
}
