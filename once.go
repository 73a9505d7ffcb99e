package admit

import (
	"strconv"
	"strings"
	"time"
)

// OnceWindow is how long AllowOrderedOnce remembers the Decision made for
// an id; a call after it decides again.
const OnceWindow = 2 * time.Minute

// MaxOnceIDLen is the longest id AllowOrderedOnce accepts, in bytes.
const MaxOnceIDLen = 256

var onceWindowArg = strconv.FormatInt(OnceWindow.Milliseconds(), 10)

// OnceRecordKey returns the key, in firstKey's cluster slot, of the record
// AllowOrderedOnce keeps for id under the first key firstKey, or the
// [ErrInvalidRequest] it would refuse them with (docs/errors.md).
func OnceRecordKey(firstKey, id string) (string, error) { return onceKey(firstKey, id) }

// onceKey names the record of id for a call whose first key is key:
//
//	<key>:once:<id>:<len(key)>      when key has a hash tag
//	{<key>}:once:<id>:<len(key)>    otherwise
//
// Either way the record's first hash tag is key's slot part, so it lives in
// key's cluster slot, and a tagged key's record starts with the key, so an
// ACL key pattern that covers the key ("~rl:*") covers its records. The
// encoding is injective: the digits after the last ":" give key's length,
// which says where key ends (at that length, a tagged key's record goes on
// with ":once:", an untagged one's with "}:once:", never both), and the id
// is what lies between. So distinct (key, id) pairs never share a record
// (FuzzOnceKey), whatever braces, separators or bytes they hold.
func onceKey(key, id string) (string, error) {
	switch {
	case id == "":
		return "", invalidRequest("AllowOrderedOnce needs a non-empty id")
	case len(id) > MaxOnceIDLen:
		return "", invalidRequest("AllowOrderedOnce id is " + strconv.Itoa(len(id)) + " bytes, over MaxOnceIDLen (" + strconv.Itoa(MaxOnceIDLen) + ")")
	case key == "":
		return "", invalidRequest("first request has an empty Key")
	}
	n := strconv.Itoa(len(key)) // below 100, no allocation
	if _, tagged := slotPart(key); tagged {
		return key + ":once:" + id + ":" + n, nil // one concatenation, one allocation
	}
	if strings.Contains(key, "}") {
		return "", invalidRequest("first key " + strconv.Quote(key) + " has no hash tag but holds a \"}\": its once-record could not share its cluster slot; give it a hash tag such as {chan:42}")
	}
	return "{" + key + "}:once:" + id + ":" + n, nil
}
