package admit

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// trustMutants break the script where the trust issue changed it; each
// must make the named real-server tests fail. They run in a child test
// binary whose every Limiter runs the mutated script (ADMIT_TEST_SCRIPT,
// read by TestMain).
var trustMutants = []struct {
	name     string
	old, new string
	caughtBy string // -test.run pattern
}{
	{"freeze-unbounded", "    if ts > latest then\n      ts, pulled = latest, true\n    end\n", "", "^(TestIntegrationClockStepBounded|TestServerClockSteppingBack)$"},
	{"freeze-bound-one-interval-late", "local latest = now + (max - 1) * per", "local latest = now + max * per", "^TestIntegrationClockStepBounded$"},
	{"acl-precheck-skipped", "local acl = redis.acl_check_cmd", "local acl = false", "^TestIntegrationACL$"},
	{"acl-denial-write-refusal-unnamed", "return refusal(r.err, 'PEXPIREAT', i)", "return redis.error_reply(r.err)", "^TestIntegrationACL$"},
	// Both PEXPIREAT checks: the precheck checks it only for the writes planned, STORE's and KEEP's.
	{"acl-pexpireat-unchecked", "        if not acl('PEXPIREAT', keys[i], '1') then\n          return refusal(nil, 'PEXPIREAT', i)\n        end\n      elseif how == KEEP then\n        if not first and not acl('PEXPIREAT', keys[i], '1') then", "        if false then\n          return refusal(nil, 'PEXPIREAT', i)\n        end\n      elseif how == KEEP then\n        if false then", "^TestIntegrationACL$"},
	// A denial's KEEP writes as STORE does.
	{"denial-rewrites-bucket", "    if how == STORE then\n      local at, ttl", "    if how then\n      local at, ttl", "^TestIntegrationDenialWritesNothing$"},
	{"denial-expiry-not-lengthened", "redis.pcall('PEXPIREAT', keys[i], full, 'GT')", "redis.pcall('PEXPIREAT', keys[i], full, 'LT')", "^TestIntegrationDenialKeepsSlowerSpecAlive$"},
	// pulled is never set, so a denied bucket whose ts was pulled back is KEEP, not STORE.
	{"pulled-ts-not-stored", "      ts, pulled = latest, true\n", "      ts = latest\n", "^TestIntegrationClockStepBounded$"},
	{"acl-first-write-refusal-unnamed", "return refusal(r.err, 'HSET', i)", "return redis.error_reply(r.err)", "^TestIntegrationACL$"},
	// Bucket 1 is written first, so HSET granted on bucket 1 alone ("hset on
	// the standard bucket only") is where this leaves bucket 1 charged
	// behind a NOPERM on bucket 2.
	{"acl-precheck-skips-a-later-write", "if not first and not acl('HSET'", "if false and not acl('HSET'", "^TestIntegrationACL$"},
	// The shipped script reading a stored ts 1 µs late: the previous release's
	// writes, read by this one, would drift during a rolling deploy.
	{"ts-read-off-by-one", "tk, ts = tk + 0, ts + 0", "tk, ts = tk + 0, ts + 1", "^TestIntegrationRollingDeploy$"},
	// A command more inside every decision: the server time the issue-12
	// script saved, spent again.
	{"time-read-twice", "local now = t[1] * 1000000 + t[2]\n", "local now = t[1] * 1000000 + t[2]\nredis.call('TIME')\n", "^TestIntegrationScriptCommands$"},
	{"acl-read-refusal-as-server-error", "string.find(err, 'ACL', 1, true) or", "false and", "^TestIntegrationACL$"},
}

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
		if strings.Count(scriptSource, m.old) != 1 {
			t.Errorf("mutant %s: %q is not in script.lua exactly once", m.name, m.old)
			continue
		}
		failed, out := run(strings.Replace(scriptSource, m.old, m.new, 1), m.caughtBy)
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
