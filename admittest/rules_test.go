package admittest

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestRuleNames: the table keeps every rule's name (users' CI filters on
// them), each once, and every check function of the package is in it.
func TestRuleNames(t *testing.T) {
	want := []string{
		"acl-precheck-arity", "acl-precheck-paths", "all-or-nothing-second-denial-charges-nothing",
		"both-allow-consume-once", "bucket-states", "cancel-in-flight-is-outcome-unknown",
		"cluster-cross-slot-refused", "cluster-hash-tag", "cluster-shards-independent",
		"concurrency-exact-count", "corrupt-state-writes-nothing", "cost-transitions",
		"first-denial-leaves-second-untouched", "foreign-hash-refused", "host-clock-plays-no-part",
		"key-schema", "lease-all-or-nothing", "lease-dead-holder-freed-at-expiry", "lease-least-privilege-user",
		"lease-never-more-than-limit", "lease-refusal-writes-nothing", "lease-release-idempotent", "lease-retry-safe-by-name",
		"live-spec-change", "lost-reply-is-outcome-unknown",
		"once-first-denial-writes-nothing", "once-id-reuse-refused", "once-records-never-collide",
		"once-replay-is-marked", "once-survives-a-lost-reply", "one-evalsha-per-decision",
		"one-state-for-both-paths", "only-declared-keys", "peek-read-only-user",
		"peek-writes-nothing", "premium-reservation", "refund-capped-at-burst",
		"refused-connection-is-not-executed", "remaining-reported", "script-flush-falls-back-once",
		"second-denial-charges-first", "transitions", "wait-honours-deadline",
		"wrong-type-writes-nothing",
	}
	var got []string
	for _, r := range rules {
		got = append(got, r.name)
	}
	if got = slices.Sorted(slices.Values(got)); !slices.Equal(got, want) {
		t.Errorf("rule names (sorted):\n got %q\nwant %q", got, want)
	}

	// Every func check<Name>(ctx, *env) error of the package is a rule.
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	inTable := map[string]bool{}
	fset := token.NewFileSet()
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, decl := range file.Decls {
			if fn, ok := decl.(*ast.FuncDecl); ok && fn.Recv == nil && strings.HasPrefix(fn.Name.Name, "check") {
				inTable[fn.Name.Name] = false
			}
		}
	}
	table, err := parser.ParseFile(fset, "rules.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	ast.Inspect(table, func(n ast.Node) bool {
		if id, ok := n.(*ast.Ident); ok {
			if _, isCheck := inTable[id.Name]; isCheck {
				inTable[id.Name] = true
			}
		}
		return true
	})
	for name, listed := range inTable {
		if !listed {
			t.Errorf("%s is not in the table of rules (rules.go)", name)
		}
	}
}

// TestRulesExplained: every rule says in one line what it holds the
// Limiter to, as testing/slogtest's cases do.
func TestRulesExplained(t *testing.T) {
	for _, r := range rules {
		if r.explanation == "" || strings.Contains(r.explanation, "\n") {
			t.Errorf("rule %s: explanation %q, want one line", r.name, r.explanation)
		}
	}
}
