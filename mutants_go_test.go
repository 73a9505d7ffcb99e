package admit

// Mutation testing of the Go side (issue 8, item 11): each mutant is a
// deliberate, named bug in error classification (exec.go) or reply
// decoding (decode and its call site in limiter.go). TestGoMutants builds
// each in a copy of the package, runs the error-class tests there, and
// fails unless the mutant's named catching test fails, and the unmutated
// copy passes.

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// goMutant is a named bug: text edits to one source file (each old text
// must occur exactly once), and the test that must catch it.
type goMutant struct {
	name    string
	file    string
	edits   [][2]string
	catcher string // a test (or subtest) name that must fail
}

var goMutants = []goMutant{
	// Classification: a class claimed without proof, or a proof ignored.
	{name: "wrongpass-outcome-unknown", file: "errors.go",
		edits:   [][2]string{{`case code == "WRONGPASS":`, `case code == "WRONGPASS" && false:`}},
		catcher: "TestIntegrationErrClassCredentialsRefused/password_rotated"},
	{name: "noauth-outcome-unknown", file: "errors.go",
		edits:   [][2]string{{`case code == "NOAUTH":`, `case code == "NOAUTH" && false:`}},
		catcher: "TestIntegrationErrClassCredentialsRefused/password_required"},
	{name: "in-script-acl-failure-not-executed", file: "errors.go",
		edits:   [][2]string{{`"OOM": true, "NOPERM": true,`, `"OOM": true, "NOPERM": true, "ACL": true,`}},
		catcher: "TestErrClassTable/acl-failure-inside-the-script"},
	{name: "script-error-not-executed", file: "errors.go",
		edits:   [][2]string{{`return unknown("the server failed the script;`, `return notExecuted("the server failed the script;`}},
		catcher: "TestErrClassTable/acl-failure-inside-the-script"},
	{name: "wrongtype-outcome-unknown", file: "errors.go",
		edits:   [][2]string{{`reason: ErrWrongType, class: ErrNotExecuted}`, `reason: ErrWrongType, class: ErrOutcomeUnknown}`}},
		catcher: "TestErrClassTable/wrongtype"},
	{name: "noslot-outcome-unknown", file: "errors.go",
		edits:   [][2]string{{`if errors.Is(err, valkey.ErrNoSlot) {`, `if errors.Is(err, valkey.ErrNoSlot) && false {`}},
		catcher: "TestIntegrationErrClassNoSlot"},
	{name: "setup-refusal-outcome-unknown", file: "errors.go",
		edits:   [][2]string{{`if errors.Is(err, valkey.ErrNoCache) {`, `if errors.Is(err, valkey.ErrNoCache) && false {`}},
		catcher: "TestIntegrationErrClassTrackingRefused"},
	{name: "dial-error-outcome-unknown", file: "errors.go",
		edits:   [][2]string{{`opErr.Op == "dial"`, `opErr.Op == "dial" && false`}},
		catcher: "TestErrClassTable/dial"},
	{name: "any-network-error-not-executed", file: "errors.go",
		edits:   [][2]string{{`opErr.Op == "dial"`, `opErr.Op != ""`}},
		catcher: "TestErrClassTable/read-error"},
	{name: "closing-not-executed", file: "errors.go",
		edits:   [][2]string{{`return unknown("the valkey client was closed;`, `return notExecuted("the valkey client was closed;`}},
		catcher: "TestIntegrationErrClassClosing"},
	{name: "connection-failure-not-executed", file: "errors.go",
		edits:   [][2]string{{`return unknown("the connection failed while`, `return notExecuted("the connection failed while`}},
		catcher: "TestErrClassTable/eof"},
	{name: "unplaced-context-error-not-executed", file: "errors.go",
		edits:   [][2]string{{`if !foreign.proven {`, `if false {`}},
		catcher: "TestErrClassTable/wrapped-context-error"},
	{name: "own-context-end-not-executed", file: "errors.go",
		edits:   [][2]string{{`return unknown("this call's context ended`, `return notExecuted("this call's context ended`}},
		catcher: "TestErrClassTable/own-cancel-in-flight"},
	{name: "another-call's-context-taken-as-own", file: "exec.go",
		edits:   [][2]string{{`&& !ownContextEnded(ctx) {`, `&& !ownContextEnded(ctx) && false {`}},
		catcher: "TestErrClassTable/another-call's-deadline"}, // TestIntegrationErrClassSharedDial too, when the shared dial races as it does in production
	{name: "every-context-error-taken-as-another-call's", file: "exec.go",
		edits:   [][2]string{{`&& !ownContextEnded(ctx) {`, `{`}},
		catcher: "TestErrClassTable/own-cancel-in-flight"},
	{name: "own-deadline-checked-an-hour-late", file: "exec.go",
		edits:   [][2]string{{`return dl == dl.Round(0) || !time.Now().Before(dl)`, `return dl == dl.Round(0) || !time.Now().Add(-time.Hour).Before(dl)`}},
		catcher: "TestErrClassTable/own-deadline-passed-timer-not-yet-fired"},
	{name: "wall-clock-deadline-trusted", file: "exec.go",
		edits:   [][2]string{{`return dl == dl.Round(0) || !time.Now().Before(dl)`, `return !time.Now().Before(dl)`}},
		catcher: "TestErrClassTable/own-deadline-without-monotonic-clock"},
	{name: "wrapped-context-error-taken-as-another-call's", file: "exec.go",
		edits:   [][2]string{{`bare := err == context.Canceled || err == context.DeadlineExceeded`, `bare := err != nil`}},
		catcher: "TestErrClassTable/wrapped-context-error"},
	{name: "nil-reply-as-connection-failure", file: "errors.go",
		edits:   [][2]string{{`if valkey.IsValkeyNil(err) {`, `if false {`}},
		catcher: "TestIntegrationErrClassNilReply"},

	// AllowOrderedOnce's record must share its first key's cluster slot.
	{name: "once-record-in-another-slot", file: "once.go",
		edits:   [][2]string{{`if _, tagged := slotPart(key); tagged {`, `if false {`}},
		catcher: "TestOnceKeySlot"},
	// Issue 19: a server without its Lua engine ran nothing.
	{name: "no-lua-engine-outcome-unknown", file: "errors.go",
		edits:   [][2]string{{`case strings.Contains(msg, noScriptingEngine):`, `case false:`}},
		catcher: "TestErrClassTable/no-scripting-engine"},
	// Issue 17: the record's name without the key's length collides.
	{name: "once-record-not-injective", file: "once.go",
		edits:   [][2]string{{`n := strconv.Itoa(len(key))`, `n := ""`}},
		catcher: "TestOnceRecordsNeverShareAKey"},
	{name: "replay-accepted-from-any-call", file: "exec.go",
		edits:   [][2]string{{`if d.replayed && c.mode != modeOnce {`, `if false {`}},
		catcher: "TestReplayShapes"},
	{name: "malformed-replay-as-bad-reply", file: "exec.go",
		edits:   [][2]string{{`if err != nil && replayed {`, `if false {`}},
		catcher: "TestReplayShapes"},
	// Issue 17: the denial cache is O(1) and forgets what a refund gave back.
	{name: "denial-cache-ring-not-advancing", file: "denialcache.go",
		edits:   [][2]string{{`c.next = (i + 1) % c.size`, `c.next = i`}},
		catcher: "TestDenialCacheFIFO"},
	{name: "denial-cache-evicted-key-kept-in-index", file: "denialcache.go",
		edits: [][2]string{{`delete(c.index, c.slots[i].key)
		}`, `}`}},
		catcher: "TestDenialCacheFIFO"},
	{name: "refund-keeps-second-key's-denial", file: "denialcache.go",
		edits:   [][2]string{{`c.invalidate(second.Key)`, `_ = second.Key`}},
		catcher: "TestDenialCacheRefund"},
	{name: "denial-sent-before-refund-cached", file: "denialcache.go",
		edits:   [][2]string{{`if !sent.After(c.dropped) {`, `if false {`}},
		catcher: "TestDenialCacheRefund"},
	{name: "refund-keeps-cached-denials", file: "limiter.go",
		edits:   [][2]string{{`l.denials.refunded(c.first, c.second)`, `_ = c.second`}},
		catcher: "TestDenialCacheRefund"},
	// Issue 17: Wait's line bounds the herd; its sleep tries for a token
	// before the deadline; its error after a refund says what ran.
	{name: "wait-line-head-never-released", file: "wait.go",
		edits:   [][2]string{{`defer func() { <-line.head }()`, `<-line.head`}},
		catcher: "TestWaitLine"},
	{name: "wait-line-never-removed", file: "wait.go",
		edits:   [][2]string{{`delete(w.lines, key)`, `_ = key`}},
		catcher: "TestWaitLine"},
	{name: "wait-jitter-past-the-deadline", file: "wait.go",
		edits:   [][2]string{{`(untilDeadline-retryAfter)/4`, `most`}},
		catcher: "TestWaitSleep"},
	{name: "wait-queued-shortcut-ignores-the-request", file: "wait.go",
		edits:   [][2]string{{`return dn.ok && dn.first == first && dn.second == s`, `return dn.ok`}},
		catcher: "TestWaitQueued"},
	{name: "wait-error-hides-the-refund", file: "wait.go",
		edits:   [][2]string{{`refunds++`, ``}},
		catcher: "TestWaitRefundsAfterSecondDenial"},
	{name: "peek-failure-kept-outcome-unknown", file: "errors.go",
		edits:   [][2]string{{`if !errors.Is(err, ErrOutcomeUnknown) {`, `if true {`}},
		catcher: "TestPeekErrorsAreNotExecuted"},
	{name: "peek-no-fallback-where-TIME-is-refused", file: "readonly.go",
		edits:   [][2]string{{`strings.Contains(err.Error(), readOnlyTimeRefused)`, `strings.Contains(err.Error(), "no such error")`}},
		catcher: "TestPeekOnMiniredis"},
	{name: "once-id-unbounded", file: "once.go",
		edits:   [][2]string{{`case len(id) > MaxOnceIDLen:`, `case len(id) > 1<<30:`}},
		catcher: "TestOnceKeyBounds"},

	// Decoding: a reply the script never gives turned into a Decision.
	{name: "call-site-bypasses-execScript", file: "exec.go", // what a merge could do
		edits: [][2]string{{`decode(execScript(ctx, script, l.client, c.keys(), c.args()), `, `decode(script.Exec(ctx, l.client, c.keys(), c.args()), `}},
		// TestIntegrationErrClassSharedDial catches it too when its race
		// of a shared dial comes about, which under the load of the
		// mutants' parallel builds it did not in 1 CI run of 3; the table
		// catches it every time.
		catcher: "TestErrClassTable/another-call's-deadline"},
	{name: "partial-write-unexplained", file: "errors.go", // the caller is not told what stays, nor how to fix it
		edits:   [][2]string{{`case code == "ADMITPARTIAL":`, `case code == "ADMITPARTIAL-":`}},
		catcher: "TestErrClassTable/partial-write"},
	{name: "parse-error-as-connection-failure", file: "exec.go",
		edits:   [][2]string{{`if valkey.IsParseErr(err) {`, `if false {`}},
		catcher: "TestErrClassDecode/return_{0,_0}"},
	{name: "packed-admission-read-as-one-count", file: "exec.go",
		edits:   [][2]string{{`if buckets == 2 {`, `if false {`}},
		catcher: "TestErrClassDecode/return_3_*_2^26_+_67108863"},
	{name: "negative-admission-count-accepted", file: "exec.go",
		edits:   [][2]string{{`if n < 0 || n >= 1<<53 {`, `if n >= 1<<53 {`}},
		catcher: "TestErrClassDecode/return_-1"},
	{name: "non-integer-field-read-as-zero", file: "exec.go",
		edits:   [][2]string{{`v, err := strconv.ParseInt(field, 10, 64)`, `v, err := strconv.ParseInt(field, 10, 64); v, err = v, nil`}},
		catcher: "TestErrClassDecode/return_'a_0_2_-1'"},
	{name: "remaining-unchecked", file: "exec.go",
		edits:   [][2]string{{`case rem1 < 0 || rem2 < -1 || (rem2 == -1) != (buckets == 1 || denied == 1):`, `case false:`}},
		catcher: "TestErrClassDecode/return_'0_0_2_5'"},
	{name: "denied-bounded-by-2-not-by-buckets", file: "exec.go",
		edits:   [][2]string{{`case denied < 0 || denied > int64(buckets):`, `case denied < 0 || denied > 2:`}},
		catcher: "TestErrClassDecode/return_'2_5_2_-1'"},
	{name: "negative-denied-accepted", file: "exec.go",
		edits:   [][2]string{{`case denied < 0 || denied > int64(buckets):`, `case denied > int64(buckets):`}},
		catcher: "TestErrClassDecode/return_'-1_5_2_-1'"},
	{name: "admission-with-a-wait-accepted", file: "exec.go",
		edits:   [][2]string{{`case (denied == 0) != (retry == 0) || retry < 0:`, `case retry < 0:`}},
		catcher: "TestErrClassDecode/return_'0_5_2_-1'"},
	{name: "negative-wait-accepted", file: "exec.go",
		edits:   [][2]string{{`case (denied == 0) != (retry == 0) || retry < 0:`, `case (denied == 0) != (retry == 0):`}},
		catcher: "TestErrClassDecode/return_'1_-5_0_-1'"},
	{name: "wait-read-in-ms", file: "exec.go",
		edits:   [][2]string{{`RetryAfter: time.Duration(retry) * time.Microsecond,`, `RetryAfter: time.Duration(retry) * time.Millisecond,`}},
		catcher: "TestErrClassDecode/return_'1_7_0_-1'"},
}

// goMutantTests are the tests run on every mutant.
const goMutantTests = "^(TestErrClass|TestIntegrationErrClass|TestOnce|TestReplayShapes|TestPeekErrorsAreNotExecuted|TestPeekOnMiniredis|TestDenialCache|TestWait)"

func (m goMutant) apply(src string) (string, error) {
	for _, ed := range m.edits {
		if n := strings.Count(src, ed[0]); n != 1 {
			return "", fmt.Errorf("mutant %s: %q occurs %d times in %s, want once; update the mutant to the source", m.name, ed[0], n, m.file)
		}
		src = strings.Replace(src, ed[0], ed[1], 1)
	}
	return src, nil
}

// TestGoMutants builds each Go mutant in a copy of the package and
// requires its catching test to fail there, after the unmutated copy has
// passed the same tests. It prints the table mutant → failing tests. It
// needs a real server (the integration tests catch some mutants), and
// ADMIT_MUTANTS=1, since it tests the tests (CI runs it once).
func TestGoMutants(t *testing.T) {
	if os.Getenv("ADMIT_MUTANTS") != "1" {
		t.Skip("tests the error-class tests themselves; set ADMIT_MUTANTS=1 to run it")
	}
	rows := goMutantRows(t)
	var b strings.Builder
	fmt.Fprintf(&b, "Go mutant → tests that failed on it (catching test first)\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "  %-48s %s\n", r[0], r[1])
	}
	t.Log(b.String())
}

// goMutantRows runs every Go mutant and returns rows of mutant name and
// the tests that caught it ("NOT CAUGHT" when its catcher passed), for
// TestGoMutants or TestMutants to print.
//
// Mutants run on several copies of the package at once (two, or one per
// CPU up to four): a run is about half compiling (CPU) and half waiting on
// servers and timeouts, so two copies on two CPUs take about 60% of the
// time of one (CI: 323 s before, 199 s after).
func goMutantRows(t *testing.T) [][2]string {
	t.Helper()
	// go test puts its own GOROOT/bin first on the test's PATH, so this
	// is the toolchain running the test (GOTOOLCHAIN=go1.25.0 included).
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("Go mutants need the go command: %v", err)
	}
	workers := max(2, min(4, runtime.GOMAXPROCS(0))) // each copy is a go build and its servers
	dirs := make(chan string, workers)
	for range workers {
		dir := t.TempDir()
		goMutantCopyPackage(t, dir)
		dirs <- dir
	}
	failLine := regexp.MustCompile(`(?m)^\s*--- FAIL: (\S+)`)
	run := func(dir string) (failed []string, out string) {
		cmd := exec.Command(goBin, "test", "-vet=off", "-count=1", "-run", goMutantTests, ".") // vet runs once, in make lint
		cmd.Dir = dir
		// Offline: everything needed is in the module cache already.
		cmd.Env = append(os.Environ(), "GOPROXY=off", "GOFLAGS=-mod=readonly", "GOWORK=off", "GOTOOLCHAIN=local")
		b, err := cmd.CombinedOutput()
		for _, m := range failLine.FindAllStringSubmatch(string(b), -1) {
			failed = append(failed, m[1])
		}
		if err != nil && len(failed) == 0 {
			failed = []string{"(did not build or run)"}
		}
		return failed, string(b)
	}
	dir := <-dirs
	if failed, out := run(dir); len(failed) > 0 {
		t.Fatalf("the error-class tests fail on an unmutated copy of the package:\n%s", out)
	}
	dirs <- dir
	sources := map[string]string{}
	for _, f := range []string{"errors.go", "exec.go", "limiter.go", "once.go", "denialcache.go", "wait.go", "readonly.go"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		sources[f] = string(b)
	}
	rows := make([][2]string, len(goMutants))
	t.Run("mutants", func(t *testing.T) { // returns when every parallel subtest has
		for i, m := range goMutants {
			t.Run(m.name, func(t *testing.T) {
				t.Parallel()
				src, err := m.apply(sources[m.file])
				if err != nil {
					t.Fatal(err)
				}
				dir := <-dirs
				defer func() { dirs <- dir }()
				goMutantWrite(t, filepath.Join(dir, m.file), src)
				defer goMutantWrite(t, filepath.Join(dir, m.file), sources[m.file])
				failed, out := run(dir)
				if !slices.Contains(failed, m.catcher) {
					t.Errorf("mutant %s: its catching test %s did not fail (failed: %v)\n%s", m.name, m.catcher, failed, out)
					rows[i] = [2]string{m.name, "NOT CAUGHT by " + m.catcher}
					return
				}
				// The catcher first, then the other leaves that failed.
				caught := []string{m.catcher}
				for _, f := range failed {
					leaf := !slices.ContainsFunc(failed, func(g string) bool { return strings.HasPrefix(g, f+"/") })
					if leaf && f != m.catcher && !strings.HasPrefix(m.catcher, f+"/") {
						caught = append(caught, f)
					}
				}
				t.Logf("caught by %s", strings.Join(caught, ", "))
				rows[i] = [2]string{m.name, strings.Join(caught, ", ")}
			})
		}
	})
	return rows
}

// goMutantCopyPackage copies the package, its tests, and the packages and
// data they use into dir.
func goMutantCopyPackage(t *testing.T, dir string) {
	t.Helper()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files { // the whole package, tests included: the catchers use its test helpers
		goMutantCopy(t, f, filepath.Join(dir, f))
	}
	for _, f := range []string{"go.mod", "go.sum", "script.lua"} {
		goMutantCopy(t, f, filepath.Join(dir, f))
	}
	for _, sub := range []string{"admittest", "internal", "testdata"} {
		err = filepath.WalkDir(sub, func(path string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(path)), 0o755); err != nil {
				return err
			}
			goMutantCopy(t, path, filepath.Join(dir, path))
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

func goMutantCopy(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	goMutantWrite(t, to, string(b))
}

func goMutantWrite(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}
