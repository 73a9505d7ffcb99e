package admit

import (
	"strconv"
	"strings"
	"time"

	"github.com/valkey-io/valkey-go"
)

// decode reads the script's reply. An admission that records nothing (a
// take or a peek) replies with an integer, which the server formats itself
// and valkey-go decodes without allocating: the tokens left, and for two
// buckets, when both counts are below 2^26, rem1 * 2^26 + rem2. Every
// other reply is one string, "denied retry_us rem1 rem2", so that
// valkey-go allocates one small buffer for it and decoding allocates
// nothing more. A replay (AllowOrderedOnce's recorded decision) is the
// string prefixed with "R ". Anything else is ErrBadReply, but for a
// malformed replay, which ran nothing: ErrCorruptState.
func decode(resp valkey.ValkeyResult, buckets uint8) (Decision, error) {
	if m, err := resp.ToMessage(); err == nil && m.IsInt64() {
		n, _ := m.ToInt64()
		return decodeAdmitted(n, buckets)
	}
	s, err := resp.ToString()
	if valkey.IsParseErr(err) {
		return Decision{}, badReply(err.Error())
	}
	if err != nil {
		return Decision{}, classify(err)
	}
	replayed := strings.HasPrefix(s, "R ")
	if replayed {
		s = s[2:]
	}
	d, err := decodeFields(s, buckets)
	if err != nil && replayed {
		return Decision{}, &callError{msg: "admit: corrupt once-record: it replays a decision AllowOrdered never makes: " + err.Error(),
			reason: ErrCorruptState, class: ErrNotExecuted}
	}
	d.replayed = replayed
	return d, err
}

// decodeFields reads "denied retry_us rem1 rem2".
func decodeFields(s string, buckets uint8) (Decision, error) {
	var f [4]int64
	rest := s
	for i := range f {
		field := rest
		if i < len(f)-1 {
			sp := strings.IndexByte(rest, ' ')
			if sp < 0 {
				return Decision{}, badReply("want 4 fields, got " + strconv.Quote(s))
			}
			field, rest = rest[:sp], rest[sp+1:]
		}
		v, err := strconv.ParseInt(field, 10, 64)
		if err != nil {
			return Decision{}, badReply("field " + strconv.Itoa(i+1) + " of " + strconv.Quote(s) + " is not an integer")
		}
		f[i] = v
	}
	denied, retry, rem1, rem2 := f[0], f[1], f[2], f[3]
	switch {
	case denied < 0 || denied > int64(buckets):
		return Decision{}, badReply("denied " + strconv.FormatInt(denied, 10) + " out of range")
	case (denied == 0) != (retry == 0) || retry < 0:
		return Decision{}, badReply("retry " + strconv.FormatInt(retry, 10) + "µs inconsistent with denied " + strconv.FormatInt(denied, 10))
	case rem1 < 0 || rem2 < -1 || (rem2 == -1) != (buckets == 1 || denied == 1):
		return Decision{}, badReply("remaining " + strconv.FormatInt(rem1, 10) + ", " + strconv.FormatInt(rem2, 10) +
			" inconsistent with " + strconv.Itoa(int(buckets)) + " buckets and denied " + strconv.FormatInt(denied, 10))
	}
	return Decision{
		Denied:     uint8(denied),
		RetryAfter: time.Duration(retry) * time.Microsecond,
		Remaining:  [2]int{int(rem1), int(rem2)},
		decided:    true,
	}, nil
}

// packShift is the bits of rem2 in a two-bucket admission's integer reply.
const packShift = 26

// decodeAdmitted reads an admission's integer reply (see decode).
func decodeAdmitted(n int64, buckets uint8) (Decision, error) {
	rem := [2]int{int(n), -1}
	if buckets == 2 {
		rem = [2]int{int(n >> packShift), int(n & (1<<packShift - 1))}
	}
	if n < 0 || n >= 1<<53 {
		return Decision{}, badReply("admission count " + strconv.FormatInt(n, 10) + " out of range")
	}
	return Decision{Remaining: rem, decided: true}, nil
}

func badReply(detail string) error {
	return &callError{msg: "admit: unexpected reply from the server: " + detail, reason: ErrBadReply, class: ErrOutcomeUnknown}
}
