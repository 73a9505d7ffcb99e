package admit_test

// Mutation testing of the tests themselves: each mutant is a deliberate,
// named bug in script.lua or in a Go source of the package, and names what
// must catch it. One table, one runner (TestMutants).

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/admittest"
	"github.com/admitkit/admit/internal/mutate"
	"github.com/admitkit/admit/internal/testserver"
	"github.com/valkey-io/valkey-go"
)

// A mutant is a named bug: edits to one file of the package, and what must
// catch it.
type mutant struct {
	name string
	// file is the file the edits change: script.lua, at its markers
	// ("--@name" at the end of a line, see internal/mutate), so that a
	// readability pass over the script leaves every mutant applicable; or a
	// Go source, by text that occurs there exactly once (text).
	file  string
	edits []mutate.Edit
	// catcher is what must catch the mutant. Empty: admittest's conformance
	// rules, run in this process against Limiters built around the mutated
	// script (with wrap, if set, around their client); at least one must
	// fail. Otherwise a test, or several separated by "|" (a subtest as
	// "TestX/sub"), of which at least one must fail when the package's
	// tests are built with the mutated file (go test -overlay).
	catcher string
	wrap    func(valkey.Client) valkey.Client
}

const scriptFile = "script.lua"

// at is one edit at a script marker: see mutate.Edit.
func at(marker, old, new string) mutate.Edit { return mutate.Edit{At: marker, Old: old, New: new} }

// text is one edit of a Go source: old, which must occur in it exactly
// once, replaced by new.
func text(old, new string) mutate.Edit { return mutate.Edit{Old: old, New: new} }

func edits(e ...mutate.Edit) []mutate.Edit { return e }

// mutants is every mutant. A mutant of a script line that bucket 2 repeats
// in lines of its own (marker name with a 2) has a twin, -bucket2, that
// breaks bucket 2's copy alone, so that each copy is proven covered.
var mutants = slices.Concat(scriptMutants, trustMutants, specMutants, goMutants)

// scriptMutants break the script's decisions; the conformance rules catch
// them.
var scriptMutants = []mutant{
	{name: "second-charged-on-first-denial", file: scriptFile, // what a pipeline of two scripts does
		edits: []mutate.Edit{at("deny1", "", "if n == 2 then\n  if tk2 >= 1 then\n    tk2 = tk2 - 1\n  end\n  how2 = STORE\nend")}},
	{name: "second-refreshed-on-first-denial", file: scriptFile,
		edits: []mutate.Edit{at("deny1", "", "if n == 2 then\n  how2 = STORE\nend")}},
	{name: "first-written-before-second-read", file: scriptFile, // bucket 1's take is stored before bucket 2's HMGET, which may then fail
		edits: []mutate.Edit{at("hmget2", "v = ",
			"if mode ~= 'p' and mode ~= 'r' and tk1 >= c1 then\n"+
				"  redis.call('HSET', keys[1], 'tokens', tk1 - c1, 'ts', ts1)\n"+
				"  local at, ttl = math.max(ts1, now) / 1000, max1 * per1 / 1000\n"+
				"  redis.call('PEXPIREAT', keys[1], (at + (-at) % 1) + (ttl + (-ttl) % 1))\n"+
				"end\n"+
				"v = ")}},
	{name: "token-taken-on-first-denial", file: scriptFile, // the denied bucket is stored one token lower; the reply is unchanged
		edits: []mutate.Edit{at("deny1", "pulled1 and STORE or KEEP", "STORE"), at("deny1-reply", "", "tk1 = tk1 - 1")}},
	{name: "second-token-taken-on-second-denial", file: scriptFile,
		edits: []mutate.Edit{at("deny2", "pulled2 and STORE or KEEP", "STORE"), at("deny2-reply", "", "tk2 = tk2 - 1")}},
	{name: "first-not-charged-on-second-denial", file: scriptFile, // the reply still says charged
		edits: []mutate.Edit{at("deny2-charge", "tk1 = tk1 - c1", ""), at("deny2-reply", "now, tk1, tk2", "now, tk1 - c1, tk2")}},
	{name: "all-first-charged-on-second-denial", file: scriptFile, // AllowAll behaves as AllowOrdered; the reply still says uncharged
		edits: []mutate.Edit{at("all-deny2", "pulled1 and STORE or KEEP,", "STORE,"), at("all-deny2-reply", "", "tk1 = tk1 - c1")}},
	{name: "all-reply-reports-first-charged", file: scriptFile, // the state is right, the reply wrong
		edits: []mutate.Edit{at("all-deny2-reply", "now, tk1, tk2", "now, tk1 - c1, tk2")}},
	{name: "all-second-rewritten-on-second-denial", file: scriptFile,
		edits: []mutate.Edit{at("all-deny2", "pulled2 and STORE or KEEP", "STORE"), at("all-deny2-reply", "", "tk2 = math.max(tk2 - 1, 0)")}},
	{name: "all-mode-ignored", file: scriptFile, // mode a decides as a take
		edits: []mutate.Edit{at("all-deny2-test", "and mode == 'a'", "and mode == 'never'")}},
	{name: "expiry-dropped", file: scriptFile,
		edits: []mutate.Edit{at("store-expire", "redis.call('PEXPIREAT', keys[1], at)", "")}},
	{name: "expiry-dropped-bucket2", file: scriptFile,
		edits: []mutate.Edit{at("store-expire2", "redis.call('PEXPIREAT', keys[2], at)", "")}},
	{name: "expiry-shorter-than-refill", file: scriptFile,
		edits: []mutate.Edit{at("store-at", "(ttl + (-ttl) % 1)", "math.floor((ttl + (-ttl) % 1) / 2)")}},
	{name: "expiry-shorter-than-refill-bucket2", file: scriptFile,
		edits: []mutate.Edit{at("store-at2", "(ttl + (-ttl) % 1)", "math.floor((ttl + (-ttl) % 1) / 2)")}},
	{name: "expiry-from-now-not-ts", file: scriptFile, // a clock step back would let the key expire before the bucket refills
		edits: []mutate.Edit{at("store-later", "if now > ts1 then\nat = now / 1000\nend", "at = now / 1000")}},
	{name: "expiry-from-now-not-ts-bucket2", file: scriptFile,
		edits: []mutate.Edit{at("store-later2", "if now > ts2 then\nat = now / 1000\nend", "at = now / 1000")}},
	{name: "denial-rewrites-bucket", file: scriptFile, // what every denial did before: HSET + PEXPIRE
		edits: []mutate.Edit{at("write-store", "how1 == STORE", "how1")}},
	{name: "denial-rewrites-bucket-bucket2", file: scriptFile,
		edits: []mutate.Edit{at("write-store2", "how2 == STORE", "how2")}},
	{name: "denial-expiry-not-lengthened", file: scriptFile, // a Spec made slower lets a denied key expire early
		edits: []mutate.Edit{at("keep-expire", "'GT'", "'LT'")}},
	{name: "denial-expiry-not-lengthened-bucket2", file: scriptFile,
		edits: []mutate.Edit{at("keep-expire2", "'GT'", "'LT'")}},
	{name: "denial-expiry-always-set", file: scriptFile, // shortens a key's expiry: no GT
		edits: []mutate.Edit{at("keep-expire", ", 'GT')", ")")}},
	{name: "denial-expiry-always-set-bucket2", file: scriptFile,
		edits: []mutate.Edit{at("keep-expire2", ", 'GT')", ")")}},
	{name: "le-where-lt-is-meant", file: scriptFile,
		edits: []mutate.Edit{at("deny1-test", "<", "<=")}},
	{name: "field-validation-skipped", file: scriptFile,
		edits: []mutate.Edit{at("field-digits", "#tk1 > 16 or #ts1 > 16 or not (find(tk1, '^%d+$') and find(ts1, '^%d+$'))", "false"), at("field-range", "tk1 >= 2 ^ 53 or ts1 >= 2 ^ 53", "false")}},
	{name: "field-validation-skipped-bucket2", file: scriptFile,
		edits: []mutate.Edit{at("field-digits2", "#tk2 > 16 or #ts2 > 16 or not (find(tk2, '^%d+$') and find(ts2, '^%d+$'))", "false"), at("field-range2", "tk2 >= 2 ^ 53 or ts2 >= 2 ^ 53", "false")}},
	{name: "wrong-type-read-as-fresh", file: scriptFile,
		edits: []mutate.Edit{at("hmget-err", "ecmd, eerr, ei = 'HMGET', v.err, 1\nbreak", "v = {false, false}")}},
	{name: "wrong-type-read-as-fresh-bucket2", file: scriptFile,
		edits: []mutate.Edit{at("hmget-err2", "ecmd, eerr, ei = 'HMGET', v.err, 2\nbreak", "v = {false, false}")}},
	{name: "timestamp-moves-backwards", file: scriptFile,
		edits: []mutate.Edit{at("refill", "if now > ts1 then", "if now < ts1 then ts1 = now end if now > ts1 then")}},
	{name: "timestamp-moves-backwards-bucket2", file: scriptFile,
		edits: []mutate.Edit{at("refill2", "if now > ts2 then", "if now < ts2 then ts2 = now end if now > ts2 then")}},
	{name: "refill-drops-remainder", file: scriptFile,
		edits: []mutate.Edit{at("refill-partial", "ts1 + gained * per1", "now")}},
	{name: "refill-drops-remainder-bucket2", file: scriptFile,
		edits: []mutate.Edit{at("refill-partial2", "ts2 + gained * per2", "now")}},
	{name: "burst-not-capped", file: scriptFile,
		edits: []mutate.Edit{at("cap", "if tk1 > max1 then\ntk1 = max1\nend", "")}},
	{name: "burst-not-capped-bucket2", file: scriptFile,
		edits: []mutate.Edit{at("cap2", "if tk2 > max2 then\ntk2 = max2\nend", "")}},
	{name: "fresh-bucket-not-full", file: scriptFile,
		edits: []mutate.Edit{at("fresh", "max1, now, true", "max1 - 1, now, true")}},
	{name: "fresh-bucket-not-full-bucket2", file: scriptFile,
		edits: []mutate.Edit{at("fresh2", "max2, now, true", "max2 - 1, now, true")}},
	{name: "retry-rounded-down-to-ms", file: scriptFile,
		edits: []mutate.Edit{at("deny1-reply", "ts1 + (c1 - tk1) * per1 - now,", "math.floor((ts1 + (c1 - tk1) * per1 - now) / 1000) * 1000,")}},
	{name: "retry-returned-in-ms", file: scriptFile,
		edits: []mutate.Edit{at("deny2-reply", "ts2 + (c2 - tk2) * per2 - now,", "(ts2 + (c2 - tk2) * per2 - now) / 1000,")}},
	{name: "retry-from-the-wrong-bucket", file: scriptFile, // bucket 1's cost and interval with bucket 2's state
		edits: []mutate.Edit{at("deny2-reply", "ts2 + (c2 - tk2) * per2 - now", "ts2 + (c1 - tk2) * per1 - now")}},
	{name: "time-from-argument-not-TIME", file: scriptFile, // the host sends its clock, as the last ARGV, and the script trusts it
		edits: []mutate.Edit{at("nargs", "#argv", "#argv - 1"), at("now", "t[1] * 1000000 + t[2]", "argv[#argv] + 0")},
		wrap:  func(c valkey.Client) valkey.Client { return hostClockClient{c} }},
	{name: "remaining-before-the-charge", file: scriptFile,
		edits: []mutate.Edit{at("both-reply", "tk1, tk2", "tk1 + c1, tk2")}},
	{name: "foreign-hash-accepted", file: scriptFile, // a user's hash gains tokens, ts and an expiry
		edits: []mutate.Edit{at("foreign", "e == 1", "e == 2")}},
	{name: "foreign-hash-accepted-bucket2", file: scriptFile,
		edits: []mutate.Edit{at("foreign2", "e == 1", "e == 2")}},
	{name: "once-record-written-not-read", file: scriptFile, // every retry decides again
		edits: []mutate.Edit{at("record-found", "if r then", "if false then")}},
	{name: "once-record-read-but-charged", file: scriptFile, // the retry returns the old Decision and charges again
		edits: []mutate.Edit{
			at("nargs", "", "local replayed"),
			at("replay", "return 'R '", "replayed = 'R '"),
			at("reply-return", "return reply", "return replayed or reply"),
		}},
	{name: "once-record-never-expires", file: scriptFile,
		edits: []mutate.Edit{at("record-write", ", 'PX', argv[na])", ")")}},
	{name: "once-replay-unmarked", file: scriptFile, // a caller settles a replay again: a double refund
		edits: []mutate.Edit{at("replay", "'R ' .. ", "")}},
	{name: "once-first-denial-recorded", file: scriptFile, // a stable id is denied for the whole window
		edits: []mutate.Edit{at("deny1-unrecorded", "record = nil", "")}},
	{name: "once-request-not-compared", file: scriptFile, // another Cost, Spec or second key gets the old decision
		edits: []mutate.Edit{at("record-reuse", "string.sub(r, bar + 1) ~= fp", "false")}},
	{name: "once-foreign-record-trusted", file: scriptFile,
		edits: []mutate.Edit{at("record-shape", "not bar or not find(r, '^[012] %d+ %d+ %-?%d+|%d+ %d+ %d+')", "false")}},
	{name: "undeclared-key-outside-prefix", file: scriptFile, // only a count of the node's keys shows it
		edits: []mutate.Edit{at("store-expire", "", "redis.call('SET', 'admit-mutant-stray', ts1)")}},
	{name: "undeclared-key-written", file: scriptFile,
		edits: []mutate.Edit{at("store-expire", "", "redis.call('SET', keys[1] .. ':last', ts1)")}},

	// The Budget API: costs, refunds, peeks, Remaining.
	{name: "cost-ignored-on-second-bucket", file: scriptFile, // a take decides and charges bucket 2 at cost 1
		edits: []mutate.Edit{at("deny2-test", "tk2 < c2", "tk2 < 1"), at("both-charge", "tk2 - c2", "tk2 - 1")}},
	{name: "retry-until-one-token-not-cost", file: scriptFile,
		edits: []mutate.Edit{at("deny1-reply", "(c1 - tk1)", "(1 - tk1)"), at("deny2-reply", "(c2 - tk2)", "(1 - tk2)")}},
	{name: "refund-above-burst", file: scriptFile,
		edits: []mutate.Edit{at("refund1", "math.min(max1, tk1 + c1)", "tk1 + c1"), at("refund2", "math.min(max2, tk2 + c2)", "tk2 + c2")}},
	{name: "refund-creates-absent-key", file: scriptFile,
		edits: []mutate.Edit{at("refund1-how", "not new1 and STORE or nil", "STORE"), at("refund2-how", "not new2 and STORE or nil", "STORE")}},
	{name: "peek-writes", file: scriptFile,
		edits: []mutate.Edit{at("writes", "mode ~= 'p'", "true")}},
	{name: "remaining-off-by-cost", file: scriptFile,
		edits: []mutate.Edit{at("both-reply", "tk1, tk2", "tk1, tk2 + c2")}},
	{name: "remaining-off-by-cost-one-bucket", file: scriptFile,
		edits: []mutate.Edit{at("one-reply", "tk1", "tk1 + c1")}},
	{name: "remaining-packed-swapped", file: scriptFile, // an integer reply's two counts in each other's place
		edits: []mutate.Edit{at("both-pack", "r1 * 2 ^ 26 + r2", "r2 * 2 ^ 26 + r1")}},
	{name: "remaining-packed-overflows", file: scriptFile, // bucket 2's count spills into bucket 1's bits
		edits: []mutate.Edit{at("both-pack-bound", "r2 >= 2 ^ 26", "r2 >= 2 ^ 27")}},
	{name: "remaining-off-by-cost-on-second-denial", file: scriptFile,
		edits: []mutate.Edit{at("deny2-reply", "now, tk1, tk2", "now, tk1 + c1, tk2")}},

	// Concurrency leases (the lease-* rules).
	{name: "lease-limit-off-by-one", file: scriptFile,
		edits: []mutate.Edit{at("lease-full", "live >= llimit", "live > llimit")}},
	{name: "lease-expired-counted-live", file: scriptFile,
		edits: []mutate.Edit{at("lease-live", "now + 1", "'-inf'")}},
	{name: "lease-expired-not-pruned", file: scriptFile,
		edits: []mutate.Edit{at("lease-prune", "pruned = lcall('ZREMRANGEBYSCORE', '-inf', now)", "")}},
	{name: "lease-key-never-expires", file: scriptFile,
		edits: []mutate.Edit{at("lease-expire", "redis.call('PEXPIREAT', lkey, at + (-at) % 1)", "")}},
	{name: "lease-key-expires-with-the-new-lease", file: scriptFile, // an older, longer lease outlives its key
		edits: []mutate.Edit{at("lease-expire", "at + (-at) % 1", "math.ceil(exp / 1000)")}},
	{name: "lease-replay-takes-again", file: scriptFile,
		edits: []mutate.Edit{at("lease-replay", "own and own + 0 > now", "false")}},
	{name: "lease-buckets-not-all-or-nothing", file: scriptFile,
		edits: []mutate.Edit{at("lease-all", "leasing, mode = true, 'a'", "leasing, mode = true, 't'")}},
	{name: "lease-refusal-prunes", file: scriptFile,
		edits: []mutate.Edit{at("lease-full", "", "redis.call('ZREMRANGEBYSCORE', lkey, '-inf', now)")}},
	{name: "lease-retry-after-a-whole-lease", file: scriptFile,
		edits: []mutate.Edit{at("lease-full-reply", "oldest[2] - now", "llease")}},
	{name: "lease-release-of-expired-reported-held", file: scriptFile,
		edits: []mutate.Edit{at("lease-release-reply", "own + 0 > now and '1' or '2'", "'1'")}},
	{name: "lease-extend-after-expiry", file: scriptFile,
		edits: []mutate.Edit{at("lease-extend-dead", "not own or own + 0 <= now", "not own")}},
	{name: "lease-extend-shortens", file: scriptFile, // ZADD GT alone would keep the score: both go
		edits: []mutate.Edit{at("lease-extend-to", "math.max(own + 0, now + llease)", "now + llease"), at("lease-extend-add", "'GT', ", "")}},
	{name: "lease-corrupt-key-accepted", file: scriptFile,
		edits: []mutate.Edit{at("lease-corrupt", "card > 10000 or (own and not whole(own)) or (latest and not whole(latest))", "false")}},
	{name: "lease-acl-precheck-skipped", file: scriptFile,
		edits: []mutate.Edit{at("lease-acl", "not acl", "true")}},
	{name: "lease-acl-precheck-skipped-with-buckets", file: scriptFile,
		edits: []mutate.Edit{at("lease-check", "lcheck(lexpired, false)", "nil")}},
	{name: "lease-acl-precheck-skipped-on-extend", file: scriptFile,
		edits: []mutate.Edit{at("lease-acl-extend", "acl and lrefused('PEXPIREAT', pcall(acl, 'PEXPIREAT', lkey, 0))", "nil")}},
	// An ACL precheck with one argument fewer than its command's arity: the
	// form Redis 8.0.2's security update refuses, which the lenient
	// servers accept, so only the rule that reads COMMAND INFO sees it.
	{name: "acl-precheck-drops-an-argument", file: scriptFile,
		edits: []mutate.Edit{at("acl-store-expire", "keys[1], 0)", "keys[1])")}},
	{name: "acl-precheck-drops-an-argument-bucket2", file: scriptFile,
		edits: []mutate.Edit{at("acl-store-hset", "'tokens', 0)", "'tokens')")}},
	{name: "acl-precheck-drops-an-argument-on-the-record", file: scriptFile,
		edits: []mutate.Edit{at("acl-record", "record, '0')", "record)")}},
	{name: "lease-acl-precheck-drops-an-argument", file: scriptFile,
		edits: []mutate.Edit{at("lease-acl-expire", "lkey, 0)", "lkey)")}},
	{name: "acl-precheck-outside-pcall", file: scriptFile,
		edits: []mutate.Edit{at("acl-store-expire", "pcall(acl, 'PEXPIREAT', keys[1], 0)", "true, acl('PEXPIREAT', keys[1], 0)")}},
	{name: "lease-remaining-before-the-charge", file: scriptFile,
		edits: []mutate.Edit{at("lease-grant-reply", "'0 0 %d %d %d %d 0', tk1,", "'0 0 %d %d %d %d 0', tk1 + c1,")}},
	{name: "lease-refusal-names-the-first-part", file: scriptFile,
		edits: []mutate.Edit{at("lease-deny-reply", "ldenied, lretry", "1, lretry")}},
}

// hostClockClient appends the host's clock, in µs, to every script
// command: the design the script's TIME call replaces.
type hostClockClient struct{ valkey.Client }

func (h hostClockClient) Do(ctx context.Context, cmd valkey.Completed) valkey.ValkeyResult {
	args := cmd.Commands()
	if len(args) >= 3 && (strings.EqualFold(args[0], "EVALSHA") || strings.EqualFold(args[0], "EVAL") ||
		strings.EqualFold(args[0], "EVALSHA_RO") || strings.EqualFold(args[0], "EVAL_RO")) {
		n, _ := strconv.Atoi(args[2])
		rest := append(append([]string(nil), args[3+n:]...), strconv.FormatInt(time.Now().UnixMicro(), 10))
		cmd = h.B().Arbitrary(args[0]).Args(args[1], args[2]).Keys(args[3 : 3+n]...).Args(rest...).Build()
	}
	return h.Client.Do(ctx, cmd)
}

// trustMutants break the script where only a real-server test sees it:
// the clock, the ACL, what a denial writes, a rolling deploy, the commands
// a decision runs, the arguments admit never sends.
var trustMutants = []mutant{
	{name: "freeze-unbounded", file: scriptFile, edits: edits(at("freeze", "if ts1 > latest then\nts1, pulled1 = latest, true\nend", "")), catcher: "TestIntegrationClockStepBounded"},
	{name: "freeze-unbounded-bucket2", file: scriptFile, edits: edits(at("freeze2", "if ts2 > latest then\nts2, pulled2 = latest, true\nend", "")), catcher: "TestIntegrationClockStepBounded"},
	{name: "freeze-bound-one-interval-late", file: scriptFile, edits: edits(at("latest", "(max1 - 1) * per1", "max1 * per1")), catcher: "TestIntegrationClockStepBounded"},
	{name: "freeze-bound-one-interval-late-bucket2", file: scriptFile, edits: edits(at("latest2", "(max2 - 1) * per2", "max2 * per2")), catcher: "TestIntegrationClockStepBounded"},
	{name: "acl-precheck-skipped", file: scriptFile, edits: edits(at("acl", "redis.acl_check_cmd", "false")), catcher: "TestIntegrationACL"},
	// Bucket 2's copy (keep-refused2) has no twin: its KEEP is never the
	// first write (bucket 1 is charged first), so the ACL precheck refuses
	// first wherever redis.acl_check_cmd exists (Valkey 7.2+, Redis 7.0+).
	{name: "acl-denial-write-refusal-unnamed", file: scriptFile, edits: edits(at("keep-refused", "ecmd, eerr, ei = 'PEXPIREAT', r.err, 1\nbreak", "return redis.error_reply(r.err)")), catcher: "TestIntegrationACL"},
	// Each PEXPIREAT check on its own: bucket 1's STORE, bucket 2's STORE
	// and bucket 2's KEEP (a second-bucket denial). A mutant of a line that
	// bucket 2 repeats has a twin, -bucket2, breaking bucket 2's copy alone.
	{name: "acl-pexpireat-unchecked", file: scriptFile, edits: edits(at("acl-store-expire", "pcall(acl, 'PEXPIREAT', keys[1], 0)", "true, true")), catcher: "TestIntegrationACL"},
	{name: "acl-pexpireat-unchecked-bucket2-store", file: scriptFile, edits: edits(at("acl-store-expire2", "pcall(acl, 'PEXPIREAT', keys[2], 0)", "true, true")), catcher: "TestIntegrationACL"},
	{name: "acl-pexpireat-unchecked-bucket2-keep", file: scriptFile, edits: edits(at("acl-keep-expire", "pcall(acl, 'PEXPIREAT', keys[2], 0)", "true, true")), catcher: "TestIntegrationACL"},
	// A denial's KEEP writes as STORE does.
	{name: "denial-rewrites-bucket", file: scriptFile, edits: edits(at("write-store", "how1 == STORE", "how1")), catcher: "TestIntegrationDenialWritesNothing"},
	{name: "denial-rewrites-bucket-bucket2", file: scriptFile, edits: edits(at("write-store2", "how2 == STORE", "how2")), catcher: "TestIntegrationDenialWritesNothing"},
	{name: "denial-expiry-not-lengthened", file: scriptFile, edits: edits(at("keep-expire", "'GT'", "'LT'")), catcher: "TestIntegrationDenialKeepsSlowerSpecAlive"},
	{name: "denial-expiry-not-lengthened-bucket2", file: scriptFile, edits: edits(at("keep-expire2", "'GT'", "'LT'")), catcher: "TestIntegrationDenialKeepsSlowerSpecAlive"},
	// pulled is never set, so a denied bucket whose ts was pulled back is KEEP, not STORE.
	{name: "pulled-ts-not-stored", file: scriptFile, edits: edits(at("pulled", "ts1, pulled1 = latest, true", "ts1 = latest")), catcher: "TestIntegrationClockStepBounded"},
	{name: "pulled-ts-not-stored-bucket2", file: scriptFile, edits: edits(at("pulled2", "ts2, pulled2 = latest, true", "ts2 = latest")), catcher: "TestIntegrationClockStepBounded"},
	{name: "acl-first-write-refusal-unnamed", file: scriptFile, edits: edits(at("store-refused", "ecmd, eerr, ei = 'HSET', r.err, 1\nbreak", "return redis.error_reply(r.err)")), catcher: "TestIntegrationACL"},
	{name: "acl-first-write-refusal-unnamed-bucket2", file: scriptFile, edits: edits(at("store-refused2", "ecmd, eerr, ei = 'HSET', r.err, 2\nbreak", "return redis.error_reply(r.err)")), catcher: "TestIntegrationACL"},
	// Bucket 1 is written first, so HSET granted on bucket 1 alone ("hset on
	// the standard bucket only") is where this leaves bucket 1 charged
	// behind a NOPERM on bucket 2.
	{name: "acl-precheck-skips-a-later-write", file: scriptFile, edits: edits(at("acl-store-hset", "pcall(acl, 'HSET', keys[2], 'tokens', 0)", "true, true")), catcher: "TestIntegrationACL"},
	// The shipped script reading a stored ts 1 µs late: the previous release's
	// writes, read by this one, would drift during a rolling deploy.
	{name: "ts-read-off-by-one", file: scriptFile, edits: edits(at("fields-parse", "ts1 + 0", "ts1 + 1")), catcher: "TestIntegrationRollingDeploy"},
	{name: "ts-read-off-by-one-bucket2", file: scriptFile, edits: edits(at("fields-parse2", "ts2 + 0", "ts2 + 1")), catcher: "TestIntegrationRollingDeploy"},
	// A command more inside every decision: server time spent again.
	{name: "time-read-twice", file: scriptFile, edits: edits(at("now", "", "redis.call('TIME')")), catcher: "TestIntegrationScriptCommands"},
	// A precheck the server raises on, reported as the ACL's refusal.
	{name: "precheck-failure-as-noperm", file: scriptFile, edits: edits(at("precheck-failed", "eok == false", "false")), catcher: "TestIntegrationPrecheckFailureNotExecuted"},
	{name: "acl-read-refusal-as-server-error", file: scriptFile, edits: edits(at("acl-words", "string.find(eerr, 'ACL', 1, true) or", "false and")), catcher: "TestIntegrationACL"},
	// Arguments admit never sends, sent directly, must be refused before
	// the first write.
	{name: "argv-digits-unchecked", file: scriptFile, edits: edits(at("argv-digits", "not (find(per1, '^%d+$') and find(max1, '^%d+$') and (c1 == '1' or find(c1, '^%d+$')))", "false")), catcher: "TestIntegrationScriptRefusesBadArgv"},
	{name: "argv-digits-unchecked-bucket2", file: scriptFile, edits: edits(at("argv-digits2", "not (find(per2, '^%d+$') and find(max2, '^%d+$') and (c2 == '1' or find(c2, '^%d+$')))", "false")), catcher: "TestIntegrationScriptRefusesBadArgv"},
	{name: "argv-range-unchecked", file: scriptFile, edits: edits(at("argv-range", "per1 < 1 or max1 < 1 or per1 * max1 > 2 ^ 50 or c1 < 1 or c1 > max1", "false")), catcher: "TestIntegrationScriptRefusesBadArgv"},
	{name: "argv-range-unchecked-bucket2", file: scriptFile, edits: edits(at("argv-range2", "per2 < 1 or max2 < 1 or per2 * max2 > 2 ^ 50 or c2 < 1 or c2 > max2", "false")), catcher: "TestIntegrationScriptRefusesBadArgv"},
	{name: "argv-burst-times-per-unbounded", file: scriptFile, edits: edits(at("argv-range", "per1 * max1 > 2 ^ 50 or ", "")), catcher: "TestIntegrationScriptRefusesBadArgv"},
	{name: "argv-burst-times-per-unbounded-bucket2", file: scriptFile, edits: edits(at("argv-range2", "per2 * max2 > 2 ^ 50 or ", "")), catcher: "TestIntegrationScriptRefusesBadArgv"},
	{name: "argv-shape-unchecked", file: scriptFile, edits: edits(at("argv-shape", "na ~= 3 * n + 1 or #keys ~= n or", "false or"), at("argv-shape-take", "#keys ~= n", "false")), catcher: "TestIntegrationScriptRefusesBadArgv"},
	{name: "argv-window-unchecked", file: scriptFile, edits: edits(at("argv-window", "not find(w, '^%d+$') or #w > 15 or w + 0 < 1", "false")), catcher: "TestIntegrationScriptRefusesBadArgv"},
}

// specMutants move NewSpec's bounds.
var specMutants = []mutant{
	{name: "NaN-accepted", file: "spec.go", edits: edits(text("case math.IsNaN(r) || math.IsInf(r, 0):", "case math.IsInf(r, 0):")), catcher: "TestSpecBounds"},
	{name: "negative-rate-accepted", file: "spec.go", edits: edits(text("case r <= 0:", "case r == 0:")), catcher: "TestSpecBounds"},
	{name: "MaxLimit-doubled", file: "spec.go", edits: edits(text("case rate > MaxLimit:", "case rate > 2*MaxLimit:")), catcher: "TestSpecBounds"},
	{name: "burst-zero-accepted", file: "spec.go", edits: edits(text("case burst < 1:", "case burst < 0:")), catcher: "TestSpecBounds"},
	{name: "refill-bound-raised", file: "spec.go", edits: edits(text("maxRefillMicros = 1 << 50", "maxRefillMicros = 1 << 51")), catcher: "TestSpecBounds"},
	{name: "refill-bound-exclusive", file: "spec.go", edits: edits(text("if micros*float64(burst) > maxRefillMicros {", "if micros*float64(burst) >= maxRefillMicros {")), catcher: "TestSpecBounds"},
	{name: "interval-truncated", file: "spec.go", edits: edits(text("micros := math.Ceil(exact)", "micros := math.Floor(exact)")), catcher: "TestSpecBounds"},
	{name: "interval-rounded-to-nearest", file: "spec.go", edits: edits(text("micros := math.Ceil(exact)", "micros := math.Round(exact)")), catcher: "TestSpecBounds"},
	{name: "interval-in-ms", file: "spec.go", edits: edits(text("exact := 1e6 / r", "exact := 1e3 / r")), catcher: "TestSpecBounds"},
	{name: "tolerance-ignored", file: "spec.go", edits: edits(text("if micros > exact*(1+RateTolerance) {", "if false {")), catcher: "TestSpecBounds"},
	{name: "float-noise-rounded-up", file: "spec.go", edits: edits(text("math.Abs(exact-near) <= exact*snapTolerance", "false")), catcher: "TestSpecBounds"},
	{name: "TTL-rounded-down", file: "spec.go", edits: edits(text("ttlMillis := (refill + 999) / 1000", "ttlMillis := refill / 1000")), catcher: "TestSpecBounds"},
}

// goMutants break error classification, reply decoding, the once-record's
// name, the denial cache, Wait's line and Peek's re-classing.
var goMutants = []mutant{
	// Classification: a class claimed without proof, or a proof ignored.
	{name: "wrongpass-outcome-unknown", file: "errors.go", edits: edits(text(`case code == "WRONGPASS":`, `case code == "WRONGPASS" && false:`)),
		catcher: "TestIntegrationErrClassCredentialsRefused/password_rotated"},
	{name: "noauth-outcome-unknown", file: "errors.go", edits: edits(text(`case code == "NOAUTH":`, `case code == "NOAUTH" && false:`)),
		catcher: "TestIntegrationErrClassCredentialsRefused/password_required"},
	{name: "in-script-acl-failure-not-executed", file: "errors.go", edits: edits(text(`"OOM": true, "NOPERM": true,`, `"OOM": true, "NOPERM": true, "ACL": true,`)),
		catcher: "TestErrClassTable/acl-failure-inside-the-script"},
	// An EOF proves nothing: the command may have run before the server
	// died (TestCrashRestart measures where such calls went).
	{name: "eof-not-executed", file: "errors.go", edits: edits(text(`return unknown("the server closed the connection or died,`, `return notExecuted("the server closed the connection or died,`)),
		catcher: "TestErrClassTable"},
	{name: "script-refusal-before-any-write-outcome-unknown", file: "errors.go", edits: edits(text(`case code == "ADMITREFUSED":`, `case code == "ADMITREFUSED" && false:`)),
		catcher: "TestIntegrationPrecheckFailureNotExecuted"},
	{name: "script-error-not-executed", file: "errors.go", edits: edits(text(`return unknown("the server failed the script;`, `return notExecuted("the server failed the script;`)),
		catcher: "TestErrClassTable/acl-failure-inside-the-script"},
	{name: "wrongtype-outcome-unknown", file: "errors.go", edits: edits(text(`reason: ErrWrongType, class: ErrNotExecuted}`, `reason: ErrWrongType, class: ErrOutcomeUnknown}`)),
		catcher: "TestErrClassTable/wrongtype"},
	{name: "noslot-outcome-unknown", file: "errors.go", edits: edits(text(`if errors.Is(err, valkey.ErrNoSlot) {`, `if errors.Is(err, valkey.ErrNoSlot) && false {`)),
		catcher: "TestIntegrationErrClassNoSlot"},
	{name: "setup-refusal-outcome-unknown", file: "errors.go", edits: edits(text(`if errors.Is(err, valkey.ErrNoCache) {`, `if errors.Is(err, valkey.ErrNoCache) && false {`)),
		catcher: "TestIntegrationErrClassTrackingRefused"},
	{name: "dial-error-outcome-unknown", file: "errors.go", edits: edits(text(`opErr.Op == "dial"`, `opErr.Op == "dial" && false`)),
		catcher: "TestErrClassTable/dial"},
	{name: "any-network-error-not-executed", file: "errors.go", edits: edits(text(`opErr.Op == "dial"`, `opErr.Op != ""`)),
		catcher: "TestErrClassTable/read-error"},
	{name: "closing-not-executed", file: "errors.go", edits: edits(text(`return unknown("the valkey client was closed;`, `return notExecuted("the valkey client was closed;`)),
		catcher: "TestIntegrationErrClassClosing"},
	{name: "connection-failure-not-executed", file: "errors.go", edits: edits(text(`return unknown("the connection failed while`, `return notExecuted("the connection failed while`)),
		catcher: "TestErrClassTable/read-error"},
	{name: "unplaced-context-error-not-executed", file: "errors.go", edits: edits(text(`if !foreign.proven {`, `if false {`)),
		catcher: "TestErrClassTable/wrapped-context-error"},
	{name: "own-context-end-not-executed", file: "errors.go", edits: edits(text(`return unknown("this call's context ended`, `return notExecuted("this call's context ended`)),
		catcher: "TestErrClassTable/own-cancel-in-flight"},
	{name: "another-call's-context-taken-as-own", file: "exec.go", edits: edits(text(`&& !ownContextEnded(ctx) {`, `&& !ownContextEnded(ctx) && false {`)),
		catcher: "TestErrClassTable/another-call's-deadline"}, // TestIntegrationErrClassSharedDial too, when the shared dial races as it does in production
	{name: "every-context-error-taken-as-another-call's", file: "exec.go", edits: edits(text(`&& !ownContextEnded(ctx) {`, `{`)),
		catcher: "TestErrClassTable/own-cancel-in-flight"},
	{name: "own-deadline-checked-an-hour-late", file: "exec.go", edits: edits(text(`return dl == dl.Round(0) || !time.Now().Before(dl)`, `return dl == dl.Round(0) || !time.Now().Add(-time.Hour).Before(dl)`)),
		catcher: "TestErrClassTable/own-deadline-passed-timer-not-yet-fired"},
	{name: "wall-clock-deadline-trusted", file: "exec.go", edits: edits(text(`return dl == dl.Round(0) || !time.Now().Before(dl)`, `return !time.Now().Before(dl)`)),
		catcher: "TestErrClassTable/own-deadline-without-monotonic-clock"},
	{name: "wrapped-context-error-taken-as-another-call's", file: "exec.go", edits: edits(text(`bare := err == context.Canceled || err == context.DeadlineExceeded`, `bare := err != nil`)),
		catcher: "TestErrClassTable/wrapped-context-error"},
	{name: "nil-reply-as-connection-failure", file: "errors.go", edits: edits(text(`if valkey.IsValkeyNil(err) {`, `if false {`)),
		catcher: "TestErrClassNilReply"},
	// AllowOrderedOnce's record must share its first key's cluster slot.
	{name: "once-record-in-another-slot", file: "once.go", edits: edits(text(`if _, tagged := slotPart(key); tagged {`, `if false {`)),
		catcher: "TestOnceKeySlot"},
	// A server without its Lua engine ran nothing.
	{name: "no-lua-engine-outcome-unknown", file: "errors.go", edits: edits(text(`case strings.Contains(msg, noScriptingEngine):`, `case false:`)),
		catcher: "TestErrClassTable/no-scripting-engine"},
	// The record's name without the key's length collides.
	{name: "once-record-not-injective", file: "once.go", edits: edits(text(`n := strconv.Itoa(len(key))`, `n := ""`)),
		catcher: "FuzzOnceKey"},
	{name: "replay-accepted-from-any-call", file: "exec.go", edits: edits(text(`if d.replayed && c.mode != modeOnce {`, `if false {`)),
		catcher: "TestReplayShapes"},
	{name: "malformed-replay-as-bad-reply", file: "exec.go", edits: edits(text(`if err != nil && replayed {`, `if false {`)),
		catcher: "TestReplayShapes"},
	// The denial cache is O(1) and forgets what a refund gave back.
	{name: "denial-cache-ring-not-advancing", file: "denialcache.go", edits: edits(text(`c.next = (i + 1) % c.size`, `c.next = i`)),
		catcher: "TestDenialCacheFIFO"},
	{name: "denial-cache-evicted-key-kept-in-index", file: "denialcache.go", edits: edits(text(`delete(c.index, c.slots[i].key)
		}`, `}`)),
		catcher: "TestDenialCacheFIFO"},
	{name: "refund-keeps-second-key's-denial", file: "denialcache.go", edits: edits(text(`c.invalidate(second.Key)`, `_ = second.Key`)),
		catcher: "TestDenialCacheRefund"},
	{name: "denial-sent-before-refund-cached", file: "denialcache.go", edits: edits(text(`if !sent.After(c.dropped) {`, `if false {`)),
		catcher: "TestDenialCacheRefund"},
	{name: "refund-keeps-cached-denials", file: "limiter.go", edits: edits(text(`l.denials.refunded(c.first, c.second)`, `_ = c.second`)),
		catcher: "TestDenialCacheRefund"},
	// Wait's line bounds the herd; its sleep tries for a token
	// before the deadline; its error after a refund says what ran.
	{name: "wait-line-head-never-released", file: "wait.go", edits: edits(text(`defer func() { <-line.head }()`, `<-line.head`)),
		catcher: "TestWaitLine"},
	{name: "wait-line-never-removed", file: "wait.go", edits: edits(text(`delete(w.lines, key)`, `_ = key`)),
		catcher: "TestWaitLine"},
	{name: "wait-jitter-past-the-deadline", file: "wait.go", edits: edits(text(`(untilDeadline-retryAfter)/4`, `most`)),
		catcher: "TestWaitSleep"},
	{name: "wait-queued-shortcut-ignores-the-request", file: "wait.go", edits: edits(text(`return dn.ok && dn.first == first && dn.second == s`, `return dn.ok`)),
		catcher: "TestWaitQueued"},
	{name: "wait-error-hides-the-refund", file: "wait.go", edits: edits(text(`refunds++`, ``)),
		catcher: "TestWaitRefundsAfterSecondDenial"},
	{name: "peek-failure-kept-outcome-unknown", file: "errors.go", edits: edits(text(`if !errors.Is(err, ErrOutcomeUnknown) {`, `if true {`)),
		catcher: "TestPeekErrorsAreNotExecuted"},
	{name: "peek-no-fallback-where-TIME-is-refused", file: "readonly.go", edits: edits(text(`strings.Contains(err.Error(), readOnlyTimeRefused)`, `strings.Contains(err.Error(), "no such error")`)),
		catcher: "TestPeekOnMiniredis"},
	{name: "once-id-unbounded", file: "once.go", edits: edits(text(`case len(id) > MaxOnceIDLen:`, `case len(id) > 1<<30:`)),
		catcher: "TestOnceKeyBounds"},
	// Decoding: a reply the script never gives turned into a Decision.
	{name: "call-site-bypasses-execScript", file: "exec.go", edits: edits(text(`decode(execScript(ctx, script, l.client, c.keys(), c.args()), `, `decode(script.Exec(ctx, l.client, c.keys(), c.args()), `)),
		// What a merge could do. TestIntegrationErrClassSharedDial catches
		// it only when its race of a shared dial comes about; the table,
		// every time.
		catcher: "TestErrClassTable/another-call's-deadline"},
	{name: "partial-write-unexplained", file: "errors.go", edits: edits(text(`case code == "ADMITPARTIAL":`, `case code == "ADMITPARTIAL-":`)),
		// the caller is not told what stays, nor how to fix it
		catcher: "TestErrClassTable/partial-write"},
	{name: "parse-error-as-connection-failure", file: "exec.go", edits: edits(text(`if valkey.IsParseErr(err) {`, `if false {`)),
		catcher: "TestErrClassDecode/return_{0,_0}"},
	{name: "packed-admission-read-as-one-count", file: "exec.go", edits: edits(text(`if buckets == 2 {`, `if false {`)),
		catcher: "TestErrClassDecode/return_3_*_2^26_+_67108863"},
	{name: "negative-admission-count-accepted", file: "exec.go", edits: edits(text(`if n < 0 || n >= 1<<53 {`, `if n >= 1<<53 {`)),
		catcher: "TestErrClassDecode/return_-1"},
	{name: "non-integer-field-read-as-zero", file: "exec.go", edits: edits(text(`v, err := strconv.ParseInt(field, 10, 64)`, `v, err := strconv.ParseInt(field, 10, 64); v, err = v, nil`)),
		catcher: "TestErrClassDecode/return_'a_0_2_-1'"},
	{name: "remaining-unchecked", file: "exec.go", edits: edits(text(`case rem1 < 0 || rem2 < -1 || (rem2 == -1) != (buckets == 1 || denied == 1):`, `case false:`)),
		catcher: "TestErrClassDecode/return_'0_0_2_5'"},
	{name: "denied-bounded-by-2-not-by-buckets", file: "exec.go", edits: edits(text(`case denied < 0 || denied > int64(buckets):`, `case denied < 0 || denied > 2:`)),
		catcher: "TestErrClassDecode/return_'2_5_2_-1'"},
	{name: "negative-denied-accepted", file: "exec.go", edits: edits(text(`case denied < 0 || denied > int64(buckets):`, `case denied > int64(buckets):`)),
		catcher: "TestErrClassDecode/return_'-1_5_2_-1'"},
	{name: "admission-with-a-wait-accepted", file: "exec.go", edits: edits(text(`case (denied == 0) != (retry == 0) || retry < 0:`, `case retry < 0:`)),
		catcher: "TestErrClassDecode/return_'0_5_2_-1'"},
	{name: "negative-wait-accepted", file: "exec.go", edits: edits(text(`case (denied == 0) != (retry == 0) || retry < 0:`, `case (denied == 0) != (retry == 0):`)),
		catcher: "TestErrClassDecode/return_'1_-5_0_-1'"},
	{name: "wait-read-in-ms", file: "exec.go", edits: edits(text(`RetryAfter: time.Duration(retry) * time.Microsecond,`, `RetryAfter: time.Duration(retry) * time.Millisecond,`)),
		catcher: "TestErrClassDecode/return_'1_7_0_-1'"},
	// Observation: a lease call missing from WithObserver, or reported
	// without what it did.
	{name: "acquire-unobserved", file: "lease.go", edits: edits(text(`l.observedLease(ctx, OpAcquire, x, x.Decision(), start, false, err)`, `_ = start`)),
		catcher: "TestObserver"},
	{name: "release-live-unreported", file: "lease.go", edits: edits(text(`x.l.observedLease(ctx, OpRelease, x, Decision{}, start, live, err)`, `x.l.observedLease(ctx, OpRelease, x, Decision{}, start, false, err)`)),
		catcher: "TestObserver"},
}

// apply returns the mutant's file, mutated.
func (m mutant) apply() (src, mutated string, err error) {
	b, err := os.ReadFile(m.file)
	if err != nil {
		return "", "", err
	}
	src = string(b)
	if m.file == scriptFile {
		mutated, err = mutate.Apply(src, "--", m.edits...)
		if err != nil {
			return "", "", fmt.Errorf("mutant %s: %w; update the mutant to the script", m.name, err)
		}
		return src, mutated, nil
	}
	mutated = src
	for _, e := range m.edits {
		if n := strings.Count(mutated, e.Old); e.At != "" || n != 1 {
			return "", "", fmt.Errorf("mutant %s: %q occurs %d times in %s, want once; update the mutant to the source", m.name, e.Old, n, m.file)
		}
		mutated = strings.Replace(mutated, e.Old, e.New, 1)
	}
	return src, mutated, nil
}

// TestMutantsApply: every mutant still finds its edits and changes its
// file, checked on every test run (TestMutants, which proves each is
// caught, runs only with ADMIT_MUTANTS=1).
func TestMutantsApply(t *testing.T) {
	seen := map[string]bool{} // a mutant may have two rows: two catchers, each proven
	for _, m := range mutants {
		if seen[m.name+" "+m.catcher] {
			t.Errorf("mutant %s caught by %q twice", m.name, m.catcher)
		}
		seen[m.name+" "+m.catcher] = true
		src, mutated, err := m.apply()
		if err != nil {
			t.Error(err)
		} else if src == mutated {
			t.Errorf("mutant %s changes nothing", m.name)
		}
	}
}

// TestMutants requires every mutant to be caught by its catcher, and
// prints the table mutant -> what caught it. A catcher must pass on the
// unmutated package first: a mutant "caught" by a check that fails anyway
// proves nothing. It needs a real server and ADMIT_MUTANTS=1, since it
// tests the tests (CI runs it once).
//
// The mutants run side by side: those the rules catch on servers of their
// own (a rule run mostly waits on its server), those a test catches a few
// at a time (a Go mutant is a build, which keeps a CPU busy).
func TestMutants(t *testing.T) {
	if os.Getenv("ADMIT_MUTANTS") != "1" {
		t.Skip("tests the tests; set ADMIT_MUTANTS=1 to run it")
	}
	targets := openTargets(t, ruleServers)
	for _, r := range admittest.Rules(t, targets[0].client, nil, targets[0].opts...) {
		if err := runRule(r); err != nil {
			if _, skip := admittest.IsSkip(err); !skip {
				t.Fatalf("the shipped script fails %s; fix that first:\n%v", r.Name, err)
			}
		}
	}
	built := newOverlayRunner(t)
	caught := make([]string, len(mutants))
	ran := make([]bool, len(mutants)) // -run may pick some
	t.Run("mutants", func(t *testing.T) {
		one := func(i int, tg *target) {
			m := mutants[i]
			by := "rules"
			if m.catcher != "" {
				by = "test"
			}
			t.Run(by+"/"+m.name, func(t *testing.T) {
				ran[i] = true
				_, mutated, err := m.apply()
				if err != nil {
					t.Fatal(err)
				}
				if m.catcher == "" {
					caught[i] = caughtByRules(t, tg, m, mutated)
				} else {
					caught[i] = built.caught(t, m, mutated)
				}
				if caught[i] == "" {
					t.Errorf("mutant %s survived", m.name)
				}
			})
		}
		byRules, byTest := make(chan int), make(chan int)
		var wg sync.WaitGroup
		for _, tg := range targets {
			wg.Go(func() {
				for i := range byRules {
					one(i, tg)
				}
			})
		}
		for range buildWorkers() {
			wg.Go(func() {
				for i := range byTest {
					one(i, nil)
				}
			})
		}
		feed := func(ch chan<- int, rules bool) {
			for i, m := range mutants {
				if (m.catcher == "") == rules {
					ch <- i
				}
			}
			close(ch)
		}
		wg.Go(func() { feed(byRules, true) })
		feed(byTest, false)
		wg.Wait()
	})
	var b strings.Builder
	b.WriteString("mutant -> what caught it (the catcher first)\n")
	for i, m := range mutants {
		if !ran[i] {
			continue
		}
		if caught[i] == "" {
			caught[i] = "NOT CAUGHT"
		}
		fmt.Fprintf(&b, "  %-11s %-48s %s\n", m.file, m.name, caught[i])
	}
	t.Log(b.String())
}

// ruleServers is how many servers the rule-caught mutants share out.
const ruleServers = 4

// buildWorkers is how many test-caught mutants run at once: one per CPU,
// two at least, four at most.
func buildWorkers() int { return max(2, min(4, runtime.GOMAXPROCS(0))) }

// A target is a server the rules run on, the tests' alone, and how to
// reach it.
type target struct {
	client valkey.Client
	opts   []admittest.Option
}

func openTargets(t *testing.T, n int) []*target {
	t.Helper()
	targets := make([]*target, n)
	for i := range targets {
		srv := testserver.Own(t)
		opt := valkey.ClientOption{InitAddress: []string{srv.Addr}, DisableCache: true}
		c, err := valkey.NewClient(opt)
		if err != nil {
			t.Fatalf("dial %s: %v", srv.Addr, err)
		}
		t.Cleanup(c.Close)
		targets[i] = &target{c, []admittest.Option{admittest.WithClientOption(opt), admittest.Owned()}}
	}
	return targets
}

// caughtByRules runs the conformance rules against Limiters built around
// the mutated script, until one fails, and returns its name.
func caughtByRules(t *testing.T, tg *target, m mutant, src string) string {
	newLimiter := func(c valkey.Client) *admit.Limiter {
		if m.wrap != nil {
			c = m.wrap(c)
		}
		return admit.NewLimiterWithScript(c, src)
	}
	for _, r := range admittest.Rules(t, tg.client, newLimiter, tg.opts...) {
		err := runRule(r)
		if _, skip := admittest.IsSkip(err); err == nil || skip {
			continue
		}
		t.Logf("evidence: %s: %s", r.Name, firstLine(err.Error()))
		return r.Name
	}
	return ""
}

func runRule(r admittest.Rule) error {
	ctx, cancel := context.WithTimeout(context.Background(), ruleTimeout)
	defer cancel()
	return r.Run(ctx)
}

// ruleTimeout bounds every rule, whatever a broken script does.
const ruleTimeout = 60 * time.Second

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	if len(s) > 160 {
		s = s[:160] + "…"
	}
	return s
}

// overlayRunner runs a mutant's catcher on the mutated package. A Go
// mutant is built with go test -overlay: the package's tests with the
// mutated file in place of the file, which stays as it is on disk. A
// script mutant, and every catcher's run on the unmutated package, run in
// a test binary built once per package, into which the overlay adds
// scriptHook: it runs the script that ADMIT_TEST_SCRIPT names in place of
// script.lua, or script.lua when that is unset.
type overlayRunner struct {
	goBin   string
	root    string // the package's directory
	dir     string
	mu      sync.Mutex           // guards bins
	bins    map[string]*prebuilt // package -> its test binary
	cleanMu sync.Mutex           // guards clean, and is held while a catcher runs on the unmutated package
	clean   map[string]string    // catcher -> the error of its run on the unmutated package ("" when it passed)
}

type prebuilt struct {
	once sync.Once
	path string
	err  error
}

// scriptHook is added to package admit in the runner's test binaries: a
// variable initialized before any of the tests' own, so that
// ScriptSource (export_test.go) reads the mutant too.
const scriptHook = `package admit

import "os"

var _ = func() int {
	if path := os.Getenv("ADMIT_TEST_SCRIPT"); path != "" {
		b, err := os.ReadFile(path)
		if err != nil {
			panic(err)
		}
		scriptSource = string(b)
	}
	return 0
}()
`

func newOverlayRunner(t *testing.T) *overlayRunner {
	// go test puts its own GOROOT/bin first on the test's PATH, so this
	// is the toolchain running the test (GOTOOLCHAIN=go1.25.0 included).
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("mutants need the go command: %v", err)
	}
	root, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	return &overlayRunner{goBin: goBin, root: root, dir: t.TempDir(), clean: map[string]string{}, bins: map[string]*prebuilt{}}
}

var failLine = regexp.MustCompile(`(?m)^\s*--- FAIL: (\S+)`)

// goCommand is the go command, offline (everything needed is in the
// module cache already), as a child that never runs the mutants itself.
func (o *overlayRunner) goCommand(args ...string) *exec.Cmd {
	cmd := exec.Command(o.goBin, args...)
	cmd.Dir = o.root
	cmd.Env = append(os.Environ(), "GOPROXY=off", "GOFLAGS="+strings.TrimSpace(os.Getenv("GOFLAGS")+" -mod=readonly"), "GOWORK=off", "GOTOOLCHAIN=local", "ADMIT_MUTANTS=", "ADMIT_REQUIRE_SERVER=1")
	return cmd
}

// writeOverlay writes an overlay that replaces (or adds) each file of
// replace, by its path in the package, with the file named, and returns
// the overlay's path.
func (o *overlayRunner) writeOverlay(name string, replace map[string]string) (string, error) {
	abs := map[string]string{}
	for file, with := range replace {
		abs[filepath.Join(o.root, file)] = with
	}
	spec, _ := json.Marshal(map[string]map[string]string{"Replace": abs})
	path := filepath.Join(o.dir, name+".overlay.json")
	return path, os.WriteFile(path, spec, 0o644)
}

// binary returns pkg's test binary with scriptHook, built on first use.
func (o *overlayRunner) binary(pkg string) (string, error) {
	o.mu.Lock()
	b := o.bins[pkg]
	if b == nil {
		b = &prebuilt{}
		o.bins[pkg] = b
	}
	o.mu.Unlock()
	b.once.Do(func() {
		hook := filepath.Join(o.dir, "script_hook.go")
		if b.err = os.WriteFile(hook, []byte(scriptHook), 0o644); b.err != nil {
			return
		}
		overlay, err := o.writeOverlay("hook", map[string]string{"mutants_script_hook.go": hook})
		if b.err = err; err != nil {
			return
		}
		b.path = filepath.Join(o.dir, strings.Trim(strings.ReplaceAll(pkg, "/", "-"), ".-")+"pkg.test")
		out, err := o.goCommand("test", "-c", "-vet=off", "-overlay", overlay, "-o", b.path, pkg).CombinedOutput()
		if err != nil {
			b.err = fmt.Errorf("building %s's tests: %v\n%s", pkg, err, out)
		}
	})
	return b.path, b.err
}

// inRoot reports whether the test that pattern (a -run pattern, from its
// start) names first is declared in the root package's test files.
func (o *overlayRunner) inRoot(pattern string) bool {
	name := pattern
	if i := strings.IndexAny(name, "$|/"); i >= 0 {
		name = name[:i]
	}
	files, _ := filepath.Glob(filepath.Join(o.root, "*_test.go"))
	for _, f := range files {
		if b, err := os.ReadFile(f); err == nil && strings.Contains(string(b), "\nfunc "+name+"(t *testing.T) {") {
			return true
		}
	}
	return false
}

// run runs the tests that pattern selects, with file replaced by the
// contents of mutated when that is not empty, and returns the tests that
// failed and the output.
func (o *overlayRunner) run(pattern, file, mutated string) (failed []string, out string) {
	pkg := "."
	if top := strings.TrimLeft(pattern, "^("); (strings.HasPrefix(top, "TestIntegration") || strings.HasPrefix(top, "TestConformance")) &&
		!o.inRoot(top) {
		pkg = "./integration" // the real-server tests, but for the few that need the package's insides
	}
	var cmd *exec.Cmd
	if mutated == "" || file == scriptFile {
		bin, err := o.binary(pkg)
		if err != nil {
			return []string{"(did not build)"}, err.Error()
		}
		cmd = exec.Command(bin, "-test.run", pattern, "-test.count=1", "-test.timeout=10m")
		cmd.Dir = filepath.Join(o.root, pkg) // where its tests read their files
		cmd.Env = append(os.Environ(), "ADMIT_MUTANTS=", "ADMIT_REQUIRE_SERVER=1", "ADMIT_TEST_SCRIPT="+mutated)
	} else {
		overlay, err := o.writeOverlay(filepath.Base(mutated), map[string]string{file: mutated})
		if err != nil {
			return []string{"(no overlay: " + err.Error() + ")"}, ""
		}
		cmd = o.goCommand("test", "-vet=off", "-count=1", "-run", pattern, "-overlay", overlay, pkg)
	}
	b, err := cmd.CombinedOutput()
	for _, m := range failLine.FindAllStringSubmatch(string(b), -1) {
		failed = append(failed, m[1])
	}
	if err != nil && len(failed) == 0 {
		failed = []string{"(did not build or run)"}
	}
	return failed, string(b)
}

// pattern is the go test -run pattern of a catcher: each of its tests,
// and each level of a subtest, matched whole.
func pattern(catcher string) string {
	var alts []string
	for _, name := range strings.Split(catcher, "|") {
		parts := strings.Split(name, "/")
		for i, p := range parts {
			parts[i] = "^" + regexp.QuoteMeta(p) + "$"
		}
		alts = append(alts, strings.Join(parts, "/"))
	}
	if len(alts) == 1 {
		return alts[0]
	}
	// go test -run splits at "/" before it reads alternatives: run each
	// top-level test whole, and require a named one to fail.
	var tops []string
	for _, name := range strings.Split(catcher, "|") {
		top, _, _ := strings.Cut(name, "/")
		tops = append(tops, regexp.QuoteMeta(top))
	}
	return "^(" + strings.Join(tops, "|") + ")$"
}

// caught runs m's catcher on the mutated package and returns what failed,
// the catcher first, or "" when no test the catcher names failed.
func (o *overlayRunner) caught(t *testing.T, m mutant, mutated string) string {
	run := pattern(m.catcher)
	o.cleanMu.Lock()
	cleanErr, ok := o.clean[run]
	if !ok { // the catcher on the unmutated package, once
		failed, out := o.run(run, "", "")
		if len(failed) > 0 {
			cleanErr = fmt.Sprintf("%s fails on the unmutated package:\n%s", m.catcher, out)
		}
		o.clean[run] = cleanErr
	}
	o.cleanMu.Unlock()
	if cleanErr != "" {
		t.Fatal(cleanErr)
	}
	path := filepath.Join(o.dir, strconv.Itoa(os.Getpid())+"-"+strings.NewReplacer("/", "-", "'", "").Replace(m.name)+filepath.Ext(m.file))
	if err := os.WriteFile(path, []byte(mutated), 0o644); err != nil {
		t.Fatal(err)
	}
	failed, out := o.run(run, m.file, path)
	var hit string
	for _, name := range strings.Split(m.catcher, "|") {
		if slices.Contains(failed, name) {
			hit = name
			break
		}
	}
	if hit == "" {
		t.Logf("failed: %v\n%s", failed, out)
		return ""
	}
	// The catcher first, then the other leaves that failed.
	caught := []string{hit}
	for _, f := range failed {
		leaf := !slices.ContainsFunc(failed, func(g string) bool { return strings.HasPrefix(g, f+"/") })
		if leaf && f != hit && !strings.HasPrefix(hit, f+"/") {
			caught = append(caught, f)
		}
	}
	return strings.Join(caught, ", ")
}
