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
	{"freeze-unbounded", "  if ts > latest then\n    ts = latest\n    pulled[i] = true\n  end\n", "", "^(TestIntegrationClockStepBounded|TestServerClockSteppingBack)$"},
	{"freeze-bound-one-interval-late", "local latest = now + (burst - 1) * interval", "local latest = now + burst * interval", "^TestIntegrationClockStepBounded$"},
	{"acl-precheck-skipped", "  if not redis.acl_check_cmd then\n    return nil\n  end\n", "  if true then\n    return nil\n  end\n", "^TestIntegrationACL$"},
	{"acl-denial-write-refusal-unnamed", "    if isACL(r.err) then\n      return noperm('PEXPIREAT', i)", "    if isACL(r.err) then\n      return redis.error_reply(r.err)", "^TestIntegrationACL$"},
	{"acl-pexpireat-unchecked", "if not redis.acl_check_cmd('PEXPIREAT', KEYS[i], '1') then", "if false then", "^TestIntegrationACL$"},
	{"denial-rewrites-bucket", "  if pulled[i] then\n    store(i, tk, ts)", "  if true then\n    store(i, tk, ts)", "^TestIntegrationDenialWritesNothing$"},
	{"denial-expiry-not-lengthened", "math.ceil(full / 1000)), 'GT')", "math.ceil(full / 1000)), 'LT')", "^TestIntegrationDenialKeepsSlowerSpecAlive$"},
	{"pulled-ts-not-stored", "  if pulled[i] then\n    store(i, tk, ts)", "  if false then\n    store(i, tk, ts)", "^TestIntegrationClockStepBounded$"},
	{"acl-first-write-refusal-unnamed", "      if isACL(r.err) then\n        return noperm('HSET', i)", "      if isACL(r.err) then\n        return redis.error_reply(r.err)", "^TestIntegrationACL$"},
	{"acl-precheck-skips-a-later-write", "if i ~= first and not redis.acl_check_cmd('HSET'", "if false and not redis.acl_check_cmd('HSET'", "^TestIntegrationACL$"},
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
