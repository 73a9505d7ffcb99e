package admit

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/admitkit/admit/internal/mutate"
)

// trustMutants break the script where the trust issue (and issue 17's
// argument checks) changed it, with edits at the script's markers (see
// internal/mutate); each must make the named real-server tests fail. They
// run in a child test binary whose every Limiter runs the mutated script
// (ADMIT_TEST_SCRIPT, read by TestMain).
var trustMutants = []struct {
	name     string
	edits    []mutate.Edit
	caughtBy string // -test.run pattern
}{
	{"freeze-unbounded", edits(at("freeze", "if ts1 > latest then\nts1, pulled1 = latest, true\nend", "")), "^(TestIntegrationClockStepBounded|TestServerClockSteppingBack)$"},
	{"freeze-unbounded-bucket2", edits(at("freeze2", "if ts2 > latest then\nts2, pulled2 = latest, true\nend", "")), "^(TestIntegrationClockStepBounded|TestServerClockSteppingBack)$"},
	{"freeze-bound-one-interval-late", edits(at("latest", "(max1 - 1) * per1", "max1 * per1")), "^TestIntegrationClockStepBounded$"},
	{"freeze-bound-one-interval-late-bucket2", edits(at("latest2", "(max2 - 1) * per2", "max2 * per2")), "^TestIntegrationClockStepBounded$"},
	{"acl-precheck-skipped", edits(at("acl", "redis.acl_check_cmd", "false")), "^TestIntegrationACL$"},
	// Bucket 2's copy (keep-refused2) has no twin: its KEEP is never the
	// first write (bucket 1 is charged first), so the ACL precheck refuses
	// first wherever redis.acl_check_cmd exists (Valkey 7.2+, Redis 7.0+).
	{"acl-denial-write-refusal-unnamed", edits(at("keep-refused", "ecmd, eerr, ei = 'PEXPIREAT', r.err, 1\nbreak", "return redis.error_reply(r.err)")), "^TestIntegrationACL$"},
	// Each PEXPIREAT check on its own: bucket 1's STORE, bucket 2's STORE
	// and bucket 2's KEEP (a second-bucket denial). A mutant of a line that
	// bucket 2 repeats has a twin, -bucket2, breaking bucket 2's copy alone.
	{"acl-pexpireat-unchecked", edits(at("acl-store-expire", "not acl('PEXPIREAT', keys[1])", "false")), "^TestIntegrationACL$"},
	{"acl-pexpireat-unchecked-bucket2-store", edits(at("acl-store-expire2", "not acl('PEXPIREAT', keys[2])", "false")), "^TestIntegrationACL$"},
	{"acl-pexpireat-unchecked-bucket2-keep", edits(at("acl-keep-expire", "not first and not acl('PEXPIREAT', keys[2])", "false")), "^TestIntegrationACL$"},
	// A denial's KEEP writes as STORE does.
	{"denial-rewrites-bucket", edits(at("write-store", "how1 == STORE", "how1")), "^TestIntegrationDenialWritesNothing$"},
	{"denial-rewrites-bucket-bucket2", edits(at("write-store2", "how2 == STORE", "how2")), "^TestIntegrationDenialWritesNothing$"},
	{"denial-expiry-not-lengthened", edits(at("keep-expire", "'GT'", "'LT'")), "^TestIntegrationDenialKeepsSlowerSpecAlive$"},
	{"denial-expiry-not-lengthened-bucket2", edits(at("keep-expire2", "'GT'", "'LT'")), "^TestIntegrationDenialKeepsSlowerSpecAlive$"},
	// pulled is never set, so a denied bucket whose ts was pulled back is KEEP, not STORE.
	{"pulled-ts-not-stored", edits(at("pulled", "ts1, pulled1 = latest, true", "ts1 = latest")), "^TestIntegrationClockStepBounded$"},
	{"pulled-ts-not-stored-bucket2", edits(at("pulled2", "ts2, pulled2 = latest, true", "ts2 = latest")), "^TestIntegrationClockStepBounded$"},
	{"acl-first-write-refusal-unnamed", edits(at("store-refused", "ecmd, eerr, ei = 'HSET', r.err, 1\nbreak", "return redis.error_reply(r.err)")), "^TestIntegrationACL$"},
	{"acl-first-write-refusal-unnamed-bucket2", edits(at("store-refused2", "ecmd, eerr, ei = 'HSET', r.err, 2\nbreak", "return redis.error_reply(r.err)")), "^TestIntegrationACL$"},
	// Bucket 1 is written first, so HSET granted on bucket 1 alone ("hset on
	// the standard bucket only") is where this leaves bucket 1 charged
	// behind a NOPERM on bucket 2.
	{"acl-precheck-skips-a-later-write", edits(at("acl-store-hset", "not first and", "false and")), "^TestIntegrationACL$"},
	// The shipped script reading a stored ts 1 µs late: the previous release's
	// writes, read by this one, would drift during a rolling deploy.
	{"ts-read-off-by-one", edits(at("fields-parse", "ts1 + 0", "ts1 + 1")), "^TestIntegrationRollingDeploy$"},
	{"ts-read-off-by-one-bucket2", edits(at("fields-parse2", "ts2 + 0", "ts2 + 1")), "^TestIntegrationRollingDeploy$"},
	// A command more inside every decision: the server time the issue-12
	// script saved, spent again.
	{"time-read-twice", edits(at("now", "", "redis.call('TIME')")), "^TestIntegrationScriptCommands$"},
	{"acl-read-refusal-as-server-error", edits(at("acl-words", "string.find(eerr, 'ACL', 1, true) or", "false and")), "^TestIntegrationACL$"},
	// Issue 17: arguments admit never sends, sent directly, must be refused
	// before the first write.
	{"argv-digits-unchecked", edits(at("argv-digits", "not (find(per1, '^%d+$') and find(max1, '^%d+$') and (c1 == '1' or find(c1, '^%d+$')))", "false")), "^TestIntegrationScriptRefusesBadArgv$"},
	{"argv-digits-unchecked-bucket2", edits(at("argv-digits2", "not (find(per2, '^%d+$') and find(max2, '^%d+$') and (c2 == '1' or find(c2, '^%d+$')))", "false")), "^TestIntegrationScriptRefusesBadArgv$"},
	{"argv-range-unchecked", edits(at("argv-range", "per1 < 1 or max1 < 1 or per1 * max1 > 2 ^ 50 or c1 < 1 or c1 > max1", "false")), "^TestIntegrationScriptRefusesBadArgv$"},
	{"argv-range-unchecked-bucket2", edits(at("argv-range2", "per2 < 1 or max2 < 1 or per2 * max2 > 2 ^ 50 or c2 < 1 or c2 > max2", "false")), "^TestIntegrationScriptRefusesBadArgv$"},
	{"argv-burst-times-per-unbounded", edits(at("argv-range", "per1 * max1 > 2 ^ 50 or ", "")), "^TestIntegrationScriptRefusesBadArgv$"},
	{"argv-burst-times-per-unbounded-bucket2", edits(at("argv-range2", "per2 * max2 > 2 ^ 50 or ", "")), "^TestIntegrationScriptRefusesBadArgv$"},
	{"argv-shape-unchecked", edits(at("argv-shape", "na ~= 3 * n + 1 or #keys ~= n or", "false or"), at("argv-shape-take", "#keys ~= n", "false")), "^TestIntegrationScriptRefusesBadArgv$"},
	{"argv-window-unchecked", edits(at("argv-window", "not find(w, '^%d+$') or #w > 15 or w + 0 < 1", "false")), "^TestIntegrationScriptRefusesBadArgv$"},
}

func edits(e ...mutate.Edit) []mutate.Edit { return e }

func at(marker, old, new string) mutate.Edit { return mutate.Edit{At: marker, Old: old, New: new} }

// TestTrustMutants requires every trust mutant to be caught, and prints
// the table mutant -> catching tests. Needs ADMIT_MUTANTS=1 and a server
// binary (VALKEY_SERVER or valkey-server on PATH), as TestMutants does.
func TestTrustMutants(t *testing.T) {
	if os.Getenv("ADMIT_MUTANTS") != "1" {
		t.Skip("tests the tests; set ADMIT_MUTANTS=1 to run it")
	}
	dir := t.TempDir()
	run := func(src, pattern string) (failed bool, out string) {
		path := filepath.Join(dir, "script.lua")
		if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(os.Args[0], "-test.run="+pattern, "-test.count=1")
		cmd.Env = append(os.Environ(), "ADMIT_TEST_SCRIPT="+path, "ADMIT_REQUIRE_SERVER=1", "ADMIT_MUTANTS=")
		b, err := cmd.CombinedOutput()
		return err != nil, string(b)
	}
	for _, m := range trustMutants {
		if failed, out := run(scriptSource, m.caughtBy); failed {
			t.Fatalf("%s fails on the unmutated script:\n%s", m.caughtBy, out)
		}
		src, err := mutate.Apply(scriptSource, "--", m.edits...)
		if err != nil {
			t.Errorf("mutant %s: %v; update the mutant to the script", m.name, err)
			continue
		}
		failed, out := run(src, m.caughtBy)
		if !failed {
			t.Errorf("mutant %s survived %s", m.name, m.caughtBy)
			continue
		}
		if strings.Contains(out, "[build failed]") || strings.Contains(out, "panic:") {
			t.Errorf("mutant %s did not run:\n%s", m.name, out)
			continue
		}
		t.Logf("caught: %-34s by %s", m.name, m.caughtBy)
	}
}

// TestTrustMutantsApply: every trust mutant still finds its markers and
// changes the shipped script, on every test run.
func TestTrustMutantsApply(t *testing.T) {
	for _, m := range trustMutants {
		src, err := mutate.Apply(scriptSource, "--", m.edits...)
		if err != nil {
			t.Errorf("mutant %s: %v", m.name, err)
		} else if src == scriptSource {
			t.Errorf("mutant %s changes nothing", m.name)
		}
	}
}
