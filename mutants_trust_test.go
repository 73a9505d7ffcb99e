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
	{"freeze-unbounded", edits(at("freeze", "if ts > latest then\nts, pulled = latest, true\nend", "")), "^(TestIntegrationClockStepBounded|TestServerClockSteppingBack)$"},
	{"freeze-bound-one-interval-late", edits(at("latest", "(max - 1) * per", "max * per")), "^TestIntegrationClockStepBounded$"},
	{"acl-precheck-skipped", edits(at("acl", "redis.acl_check_cmd", "false")), "^TestIntegrationACL$"},
	{"acl-denial-write-refusal-unnamed", edits(at("keep-refused", "refusal(r.err, 'PEXPIREAT', i)", "redis.error_reply(r.err)")), "^TestIntegrationACL$"},
	// Both PEXPIREAT checks: the precheck checks it only for the writes planned, STORE's and KEEP's.
	{"acl-pexpireat-unchecked", edits(at("acl-store-expire", "not acl('PEXPIREAT', keys[i], '1')", "false"),
		at("acl-keep-expire", "not first and not acl('PEXPIREAT', keys[i], '1')", "false")), "^TestIntegrationACL$"},
	// A denial's KEEP writes as STORE does.
	{"denial-rewrites-bucket", edits(at("write-store", "how == STORE", "how")), "^TestIntegrationDenialWritesNothing$"},
	{"denial-expiry-not-lengthened", edits(at("keep-expire", "'GT'", "'LT'")), "^TestIntegrationDenialKeepsSlowerSpecAlive$"},
	// pulled is never set, so a denied bucket whose ts was pulled back is KEEP, not STORE.
	{"pulled-ts-not-stored", edits(at("pulled", "ts, pulled = latest, true", "ts = latest")), "^TestIntegrationClockStepBounded$"},
	{"acl-first-write-refusal-unnamed", edits(at("store-refused", "refusal(r.err, 'HSET', i)", "redis.error_reply(r.err)")), "^TestIntegrationACL$"},
	// Bucket 1 is written first, so HSET granted on bucket 1 alone ("hset on
	// the standard bucket only") is where this leaves bucket 1 charged
	// behind a NOPERM on bucket 2.
	{"acl-precheck-skips-a-later-write", edits(at("acl-store-hset", "not first and", "false and")), "^TestIntegrationACL$"},
	// The shipped script reading a stored ts 1 µs late: the previous release's
	// writes, read by this one, would drift during a rolling deploy.
	{"ts-read-off-by-one", edits(at("fields-parse", "ts + 0", "ts + 1")), "^TestIntegrationRollingDeploy$"},
	// A command more inside every decision: the server time the issue-12
	// script saved, spent again.
	{"time-read-twice", edits(at("now", "", "redis.call('TIME')")), "^TestIntegrationScriptCommands$"},
	{"acl-read-refusal-as-server-error", edits(at("acl-words", "string.find(err, 'ACL', 1, true) or", "false and")), "^TestIntegrationACL$"},
	// Issue 17: arguments admit never sends, sent directly, must be refused
	// before the first write.
	{"argv-digits-unchecked", edits(at("argv-digits", "not (find(per, '^%d+$') and find(max, '^%d+$') and (c == '1' or find(c, '^%d+$')))", "false")), "^TestIntegrationScriptRefusesBadArgv$"},
	{"argv-range-unchecked", edits(at("argv-range", "per < 1 or max < 1 or per * max > MAX_REFILL or c < 1 or c > max", "false")), "^TestIntegrationScriptRefusesBadArgv$"},
	{"argv-burst-times-per-unbounded", edits(at("argv-range", "per * max > MAX_REFILL or ", "")), "^TestIntegrationScriptRefusesBadArgv$"},
	{"argv-shape-unchecked", edits(at("argv-shape", "na ~= 3 * n + (argv[3 * n + 1] and 1 or 0) or #keys ~= n or", "false or")), "^TestIntegrationScriptRefusesBadArgv$"},
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
