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
			if _, tagged := slotPart(key); tagged || !strings.Contains(key, "}") {
				t.Fatalf("onceKey(%q) refused: %v", key, err)
			}
			continue
		}
		if keySlot(rec) != keySlot(key) {
			t.Fatalf("record %q is in slot %d, its key %q in %d", rec, keySlot(rec), key, keySlot(key))
		}
	}
}

// FuzzOnceKey: two distinct (key, id) pairs that onceKey accepts never get
// the same record, and every record hashes to its key's cluster slot. The
// seeds are the collisions of the encoding before the fix ("k" and "{k}"
// with one id; "a{t}" with id "x:once:y" and "a{t}:once:x" with id "y").
// Run with: go test -run '^$' -fuzz FuzzOnceKey
func FuzzOnceKey(f *testing.F) {
	for _, s := range [][4]string{
		{"k", "x", "{k}", "x"},
		{"a{t}", "x:once:y", "a{t}:once:x", "y"},
		{"{k}:once:x", "y", "{k}", "x:once:y"},
		{"{}", "x", "{}x", ""},
		{"a{b}c", "\x00", "a{b}c\x00", ""},
		{"{{a}}", "}", "{{a}", "}}"},
	} {
		f.Add(s[0], s[1], s[2], s[3])
	}
	f.Fuzz(func(t *testing.T, k1, id1, k2, id2 string) {
		r1, err1 := onceKey(k1, id1)
		r2, err2 := onceKey(k2, id2)
		if err1 == nil && keySlot(r1) != keySlot(k1) {
			t.Fatalf("record %q of key %q is in slot %d, the key in %d", r1, k1, keySlot(r1), keySlot(k1))
		}
		if err1 != nil || err2 != nil || k1 == k2 && id1 == id2 {
			return
		}
		if r1 == r2 {
			t.Fatalf("(%q, %q) and (%q, %q) share the record %q", k1, id1, k2, id2, r1)
		}
	})
}
