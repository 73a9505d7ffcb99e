package admit

import (
	"context"
	_ "embed"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/admitkit/admit/internal/testserver"
	"github.com/valkey-io/valkey-go"
)

// referenceScript is script.lua as of commit 8d2bc0b (its two buckets
// served by one loop): the behaviour that the shipped script, rewritten for
// the server's time (issue 22), must keep byte for byte. A change of
// behaviour made on purpose replaces it.
//
//go:embed testdata/script_8d2bc0b.lua
var referenceScript string

// TestIntegrationScriptMatchesReference calls the shipped script and the
// reference script (testdata/script_8d2bc0b.lua) on the same seeded random
// calls, each from the same stored state and with the same clock, and
// requires the same reply or error, byte for byte (but for the shipped
// script's integer replies, which must come exactly where decode expects
// them and say the same), and the same state after: every key's type, value and absolute expiry. The calls are what
// any user allowed EVAL can send: valid and invalid arguments, every mode,
// buckets valid, corrupt, foreign, of the wrong type or missing, records
// valid, reused or corrupt, and users short of one permission or another.
// Both scripts read a fixed clock in place of TIME (a day ahead of the
// server's, so that every expiry written lies in the future), the one
// change made to either. ADMIT_REFERENCE_CALLS sets the number of calls
// (default 3000).
func TestIntegrationScriptMatchesReference(t *testing.T) {
	srv := testserver.Own(t)
	admin := testserver.NewClient(t, srv)
	ctx := context.Background()
	tm, err := admin.Do(ctx, admin.B().Time().Build()).AsStrSlice()
	if err != nil {
		t.Fatal(err)
	}
	sec, err := strconv.ParseInt(tm[0], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	sec += 86400
	const usec = 123456
	now := sec*1_000_000 + usec
	clock := fmt.Sprintf("{'%d', '%d'}", sec, usec)
	fixed := func(src string) string {
		if strings.Count(src, "redis.pcall('TIME')") != 1 {
			t.Fatal("the script reads TIME other than once, with redis.pcall('TIME')")
		}
		return strings.Replace(src, "redis.pcall('TIME')", clock, 1)
	}
	// The shipped script knows one mode more, 'a' (AllowAll), which the
	// calls never send; its refusals of a bad shape list it.
	reference := strings.ReplaceAll(referenceScript, "mode t, p, r or o", "mode t, a, p, r or o")
	scripts := [2]string{fixed(reference), fixed(scriptSource)}

	// Users: each short of one thing a call may need. EVAL itself refuses
	// the read-only ones; the selectors grant a command on bucket 1's key
	// only.
	users := map[string][]string{
		"default":           nil,
		"no-pexpireat":      {"+@all", "-pexpireat", "~*"},
		"no-hset":           {"+@all", "-hset", "~*"},
		"no-set":            {"+@all", "-set", "~*"},
		"no-get":            {"+@all", "-get", "~*"},
		"no-exists":         {"+@all", "-exists", "~*"},
		"read-only":         {"+@all", "%R~*"},
		"hset-b1-only":      {"+@all", "-hset", "~*", "(+hset ~*b1)"},
		"pexpireat-b1-only": {"+@all", "-pexpireat", "~*", "(+pexpireat ~*b1)"},
	}
	clients := map[string]valkey.Client{"default": admin}
	var names []string
	for name, rules := range users {
		names = append(names, name)
		if rules == nil {
			continue
		}
		args := append([]string{"SETUSER", name, "reset", "on", "nopass"}, rules...)
		if err := admin.Do(ctx, admin.B().Arbitrary("ACL").Args(args...).Build()).Error(); err != nil {
			t.Fatal(err)
		}
		c, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{srv.Addr}, Username: name, Password: "x",
			TLSConfig: srv.TLS, DisableCache: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		clients[name] = c
	}
	slices.Sort(names)

	prefix := testserver.Prefix(t, admin)
	b1, b2, rec := prefix+"b1", prefix+"b2", prefix+"rec"
	all := []string{b1, b2, rec}

	calls := 3000
	if s := os.Getenv("ADMIT_REFERENCE_CALLS"); s != "" {
		if calls, err = strconv.Atoi(s); err != nil {
			t.Fatal(err)
		}
	}
	rng := rand.New(rand.NewPCG(22, 8))
	pick := func(xs ...string) string { return xs[rng.IntN(len(xs))] }
	num := func() string {
		if rng.IntN(12) > 0 {
			return pick("1", "1000", "1000000", "3600000000", "3", "20", "2", "1073741824")
		}
		return pick("0", "-1", "1.5", "abc", "nan", "inf", "0x10", " 5", "5 ", "", "1e3", "05",
			"9007199254740993", "1099511627776", "2048", "+5", "-0")
	}
	type cmd struct {
		name string
		args []string
	}
	var state []cmd // the stored state of one call, as commands
	field := func() string {
		if rng.IntN(5) > 0 {
			return strconv.FormatInt(now+int64(rng.IntN(4_000_000_000))-2_000_000_000, 10)
		}
		return pick("abc", "1.5", " 5", "", "-1", "12345678901234567", "9007199254740992", "9007199254740991",
			"00000000000000001", "1e3", "0x10", strconv.FormatInt(now+3_600_000_000_000, 10))
	}
	tokens := func() string {
		if rng.IntN(5) > 0 {
			return strconv.Itoa(rng.IntN(4) * rng.IntN(8))
		}
		return pick("abc", "-1", "1.5", "", "9007199254740992", "1073741824", "05")
	}
	bucket := func(key string) {
		switch rng.IntN(12) {
		case 0: // missing
		case 1:
			state = append(state, cmd{"HSET", []string{key, "tokens", tokens()}})
		case 2:
			state = append(state, cmd{"HSET", []string{key, "ts", field()}})
		case 3:
			state = append(state, cmd{"HSET", []string{key, "name", "alice"}})
		case 4:
			state = append(state, cmd{"SET", []string{key, "x"}})
		case 5:
			state = append(state, cmd{"RPUSH", []string{key, "x"}})
		default:
			state = append(state, cmd{"HSET", []string{key, "tokens", tokens(), "ts", field()}})
		}
		if len(state) > 0 && state[len(state)-1].args[0] == key && rng.IntN(2) == 0 {
			state = append(state, cmd{"PEXPIREAT", []string{key, strconv.FormatInt(now/1000+int64(rng.IntN(7_200_000)), 10)}})
		}
	}

	snapshot := func() string {
		var b strings.Builder
		for _, k := range all {
			typ, err := admin.Do(ctx, admin.B().Type().Key(k).Build()).ToString()
			if err != nil {
				t.Fatal(err)
			}
			var val any
			switch typ {
			case "hash":
				m, err := admin.Do(ctx, admin.B().Hgetall().Key(k).Build()).AsStrMap()
				if err != nil {
					t.Fatal(err)
				}
				val = m
			case "string":
				val, _ = admin.Do(ctx, admin.B().Get().Key(k).Build()).ToString()
			case "list":
				val, _ = admin.Do(ctx, admin.B().Lrange().Key(k).Start(0).Stop(-1).Build()).AsStrSlice()
			}
			at, err := admin.Do(ctx, admin.B().Arbitrary("PEXPIRETIME").Keys(k).Build()).AsInt64()
			if err != nil {
				t.Fatal(err)
			}
			if k == rec && at > 0 {
				// The record's window is relative (SET PX) to the real
				// clock, which moves between the two calls: its expiry
				// is compared in whole seconds from now.
				ms, err := admin.Do(ctx, admin.B().Pttl().Key(k).Build()).AsInt64()
				if err != nil {
					t.Fatal(err)
				}
				at = (ms + 500) / 1000
			}
			fmt.Fprintf(&b, "%s %s %v expiry %d; ", strings.TrimPrefix(k, prefix), typ, val, at)
		}
		return b.String()
	}
	// run returns the reply and the state after. An integer reply (the
	// shipped script's untracked admissions, see decode) is written as the
	// string the reference replies, and integer is set.
	run := func(c valkey.Client, src string, keys, args []string) (outcome string, integer bool) {
		for _, k := range all {
			if err := admin.Do(ctx, admin.B().Del().Key(k).Build()).Error(); err != nil {
				t.Fatal(err)
			}
		}
		for _, s := range state {
			if err := admin.Do(ctx, admin.B().Arbitrary(s.name).Keys(s.args[0]).Args(s.args[1:]...).Build()).Error(); err != nil {
				t.Fatalf("%s %q: %v", s.name, s.args, err)
			}
		}
		reply, integer, err := replyText(c.Do(ctx, c.B().Eval().Script(src).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()), len(keys))
		if err != nil {
			reply = "error: " + err.Error()
		}
		return reply + " | " + snapshot(), integer
	}
	// untracked says whether the shipped script must make its reply an
	// integer: an admission by a take or a peek, with every count below
	// 2^26 when there are two.
	untracked := func(mode, reply string) bool {
		var rem1, rem2 int64
		if _, err := fmt.Sscanf(reply, "0 0 %d %d", &rem1, &rem2); err != nil || (mode != "" && mode != "t" && mode != "p") {
			return false
		}
		return rem2 == -1 || (rem1 < 1<<26 && rem2 < 1<<26)
	}

	differ := 0
	outcomes := map[string]int{} // the reference's replies, by kind
	for i := range calls {
		n := 1 + rng.IntN(2)
		if rng.IntN(40) == 0 {
			n = rng.IntN(4)
		}
		var args []string
		for range n {
			per, burst := pick("1", "1000", "1000000", "3600000000"), pick("1", "2", "3", "20", "1000", "1073741824")
			if rng.IntN(3) == 0 {
				per, burst = num(), num()
			}
			args = append(args, per, burst, pick("1", "1", "2", "3", num()))
		}
		keys := []string{b1, b2}[:min(n, 2)]
		mode := pick("", "", "", "", "t", "p", "r", "o", "o", "x")
		if mode != "" {
			args = append(args, mode)
		}
		if mode == "o" {
			keys = append(keys, rec)
			if rng.IntN(5) > 0 {
				args = append(args, pick("120000", "3600000"))
			} else {
				args = append(args, pick("abc", "0", "-1", "1.5", "", "1000000000000000"))
			}
		}
		if rng.IntN(30) == 0 {
			keys = keys[:rng.IntN(len(keys)+1)]
		}
		if rng.IntN(30) == 0 {
			args = args[:rng.IntN(len(args)+1)]
		}
		state = state[:0]
		bucket(b1)
		bucket(b2)
		if mode == "o" {
			fp := strings.Join(args[:min(len(args), 3)], " ")
			if n == 2 && len(args) >= 6 {
				fp += " " + strings.Join(args[3:6], " ") + " " + b2
			}
			switch rng.IntN(6) {
			case 0:
				state = append(state, cmd{"SET", []string{rec, "0 0 5 -1|" + fp}})
			case 1:
				state = append(state, cmd{"SET", []string{rec, "2 1000 4 0|" + fp + " 9"}})
			case 2:
				state = append(state, cmd{"SET", []string{rec, pick("garbage", "0 0 5|"+fp, "")}})
			case 3:
				state = append(state, cmd{"HSET", []string{rec, "a", "b"}})
			}
		}
		user := "default"
		if rng.IntN(4) == 0 {
			user = names[rng.IntN(len(names))]
		}
		c := clients[user]
		want, _ := run(c, scripts[0], keys, args)
		got, integer := run(c, scripts[1], keys, args)
		outcome := want[:strings.Index(want, " | ")]
		sent := "" // the mode the script reads, as it reads it: args may be cut short
		if k := len(args) - len(args)%3; k < len(args) {
			sent = args[k]
		}
		if integer != untracked(sent, outcome) {
			differ++
			t.Errorf("call %d: mode %q, reference reply %q: the shipped script replied with an integer: %v", i, sent, outcome, integer)
		}
		if i := strings.IndexAny(outcome, " :"); i > 0 && !strings.HasPrefix(outcome, "error") {
			outcome = outcome[:i]
		} else if i := strings.Index(outcome, " admit:"); i > 0 {
			outcome = outcome[:i]
		}
		outcomes[outcome]++
		if got != want {
			differ++
			if differ <= 20 {
				t.Errorf("call %d: user %s, keys %d, args %q, state %v:\nreference %s\nshipped   %s", i, user, len(keys), args, state, want, got)
			}
		}
	}
	if differ > 0 {
		t.Errorf("%d of %d calls differ", differ, calls)
	}
	t.Logf("%d calls, the reference's outcomes: %v", calls, outcomes)
}
