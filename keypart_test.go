package admit_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/admitkit/admit"
	"github.com/valkey-io/valkey-go"
)

// hostileKeyInputs are values a client may send where a key is built from
// what it sends: empty, braces that move or empty a hash tag, a megabyte,
// bytes that are not UTF-8, separators and control bytes.
func hostileKeyInputs() []string {
	return []string{
		"", "}", "}x", "{", "{}", "}{", "{x}", "{{}}", ":", "a:b", " ", "\x00", "\r\n",
		strings.Repeat("x", 1<<20), strings.Repeat("{", 1<<20),
		"\xff\xfe\xfd", "\xc3", "caf\xc3\xa9", "\xed\xa0\x80", // invalid UTF-8, a UTF-8 é, a lone surrogate
	}
}

// TestKeyPart: every input gives KeyPartLen bytes of the URL-safe base64
// alphabet (so no brace, colon or non-ASCII byte), the same input the
// same part, distinct inputs distinct parts, and a part that is a valid
// hash tag: two keys built around it are in one cluster slot.
func TestKeyPart(t *testing.T) {
	inputs := hostileKeyInputs()
	seen := map[string]string{}
	for _, s := range inputs {
		p := admit.KeyPart(s)
		if len(p) != admit.KeyPartLen {
			t.Errorf("KeyPart(%.20q) = %q: %d bytes, want %d", s, p, len(p), admit.KeyPartLen)
		}
		for i := 0; i < len(p); i++ {
			if c := p[i]; !(c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				t.Errorf("KeyPart(%.20q) = %q holds %q at %d", s, p, c, i)
			}
		}
		if !utf8.ValidString(p) {
			t.Errorf("KeyPart(%.20q) = %q is not valid UTF-8", s, p)
		}
		if again := admit.KeyPart(strings.Clone(s)); again != p {
			t.Errorf("KeyPart(%.20q) = %q, then %q", s, p, again)
		}
		if other, ok := seen[p]; ok {
			t.Errorf("KeyPart(%.20q) = KeyPart(%.20q) = %q", s, other, p)
		}
		seen[p] = s
	}
	// A known answer, so that the part cannot change between versions
	// (keys built from it would then name other buckets after a deploy):
	// the first 24 bytes of SHA-256("") in URL-safe base64.
	if got, want := admit.KeyPart(""), "47DEQpj8HBSa-_TImW-5JCeuQeRkm5NM"; got != want {
		t.Errorf("KeyPart(\"\") = %q, want %q", got, want)
	}
}

// TestKeyPartKeysShareASlot: two keys with KeyPart as their hash tag pass
// the cross-slot check of a cluster client before anything is sent, for
// every hostile input, where the raw input would not.
func TestKeyPartKeysShareASlot(t *testing.T) {
	spec := admit.MustSpec(1, 1)
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // a done context: admit refuses it before sending, after the key checks
	lim := admit.New(keyPartClusterClient{})
	for _, s := range hostileKeyInputs() {
		tag := admit.KeyPart(s)
		_, err := lim.AllowOrdered(ctx, admit.Request{Key: "rl:{" + tag + "}:own", Spec: spec}, &admit.Request{Key: "rl:{" + tag + "}:pool", Spec: spec})
		if !errors.Is(err, context.Canceled) || errors.Is(err, admit.ErrInvalidRequest) {
			t.Errorf("KeyPart(%.20q): %v; want only the done context refused", s, err)
		}
	}
	_, err := lim.AllowOrdered(ctx, admit.Request{Key: "rl:{}x}:own", Spec: spec}, &admit.Request{Key: "rl:{}x}:pool", Spec: spec})
	if !errors.Is(err, admit.ErrCrossSlot) {
		t.Errorf("raw \"}x\": %v; want a cross-slot refusal (else this test cannot tell)", err)
	}
}

// keyPartClusterClient is a cluster client to admit's slot check; its
// other methods are the nil interface's, so a call that reached the
// network would panic.
type keyPartClusterClient struct{ valkey.Client }

func (keyPartClusterClient) Mode() valkey.ClientMode { return valkey.ClientModeCluster }

func ExampleKeyPart() {
	for _, user := range []string{"alice", "", "}x", strings.Repeat("A", 1<<20)} {
		part := admit.KeyPart(user)
		fmt.Println(len(part), strings.ContainsAny(part, "{}:"), "rl:{"+part+"}:own")
	}
	// Output:
	// 32 false rl:{K9gGyX8OAK8aH8Myj6djqSaXI8jbj6xP}:own
	// 32 false rl:{47DEQpj8HBSa-_TImW-5JCeuQeRkm5NM}:own
	// 32 false rl:{d5lHEeXeagqJjdvuxmpx2oVJ9gAMgPVX}:own
	// 32 false rl:{TimtGKufQtfCM1AHcaOdfIUrIAuvMo_Q}:own
}
