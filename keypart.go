package admit

import (
	"crypto/sha256"
	"encoding/base64"
)

// KeyPartLen is the length, in bytes, of every string [KeyPart] returns.
const KeyPartLen = 32

// KeyPart returns a KeyPartLen-byte URL-safe digest of s, fit for any part
// of a key a client controls (docs/key-schema.md).
func KeyPart(s string) string {
	sum := sha256.Sum256([]byte(s))
	var out [KeyPartLen]byte
	base64.RawURLEncoding.Encode(out[:], sum[:KeyPartLen*3/4])
	return string(out[:])
}
