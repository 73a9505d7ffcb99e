package admit

import (
	"crypto/sha256"
	"encoding/base64"
)

// KeyPartLen is the length, in bytes, of every string [KeyPart] returns.
const KeyPartLen = 32

// KeyPart returns a fixed-length stand-in for s, fit to be part of a
// bucket's key whatever s holds: KeyPartLen bytes of the URL-safe base64
// alphabet (A-Z, a-z, 0-9, '-' and '_'), with no brace, colon, space or
// byte outside printable ASCII. It is the first 192 bits of s's SHA-256
// digest, so equal strings give equal parts and distinct strings give
// distinct parts (a collision would take about 2^96 tries to find).
//
// Use it wherever a value a client controls becomes a key: a header, a
// path, a user id or an API token. The raw value could be empty (a missing
// header), megabytes long, or hold "{" and "}", which move a key's hash tag
// on Valkey Cluster and so put the two keys of a request in different
// slots. KeyPart's output keeps a key short, and it can be the hash tag
// itself:
//
//	user := admit.KeyPart(r.Header.Get("X-User"))
//	own := admit.Request{Key: "rl:{" + user + "}:own", Spec: perUser}
//	pool := admit.Request{Key: "rl:{" + user + "}:pool", Spec: perUserPool}
//
// An empty s has a part of its own, like any other value: requests without
// the header share one bucket rather than escape the limit.
//
// KeyPart is a digest, not encryption: anyone who can guess s can compute
// its part. It uses crypto/sha256 only, which FIPS 140 mode allows.
func KeyPart(s string) string {
	sum := sha256.Sum256([]byte(s))
	var out [KeyPartLen]byte
	base64.RawURLEncoding.Encode(out[:], sum[:KeyPartLen*3/4])
	return string(out[:])
}
