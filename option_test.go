package admit

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"strings"
	"testing"
)

// TestWithoutACLPrecheckSource: WithoutACLPrecheck's script is script.lua
// with one line changed, the one that fetches redis.acl_check_cmd, which
// script.lua holds exactly once, and nothing else changed (its indentation
// included). A script.lua that renames or repeats that line fails here, not
// at run time.
func TestWithoutACLPrecheckSource(t *testing.T) {
	if n := strings.Count(scriptSource, aclPrecheckLine); n != 1 {
		t.Fatalf("script.lua holds %q %d times; want exactly once (WithoutACLPrecheck replaces it)", aclPrecheckLine, n)
	}
	src, got := strings.Split(scriptSource, "\n"), strings.Split(withoutACLPrecheck(scriptSource), "\n")
	if len(got) != len(src) {
		t.Fatalf("the variant has %d lines, script.lua %d", len(got), len(src))
	}
	var differ []int
	for i := range src {
		if got[i] != src[i] {
			differ = append(differ, i)
		}
	}
	if len(differ) != 1 {
		t.Fatalf("the variant differs from script.lua on lines %v; want one line", differ)
	}
	i := differ[0]
	indent := src[i][:len(src[i])-len(strings.TrimLeft(src[i], " \t"))]
	if src[i] != indent+aclPrecheckLine || got[i] != indent+aclSkippedLine {
		t.Errorf("line %d: script.lua %q, variant %q; want %q and %q, indented alike", i+1, src[i], got[i], aclPrecheckLine, aclSkippedLine)
	}
}

// TestWithoutACLPrecheckRunsTheVariant: a Limiter built with
// WithoutACLPrecheck sends the variant's SHA-1 for a take, a refund and
// AllowOrderedOnce, and falls back to EVAL of the variant's source on
// NOSCRIPT; its Peek sends the shipped script's, read-only. Without the
// option every one names the shipped script.
func TestWithoutACLPrecheckRunsTheVariant(t *testing.T) {
	sha := func(s string) string { sum := sha1.Sum([]byte(s)); return hex.EncodeToString(sum[:]) }
	variant := withoutACLPrecheck(scriptSource)
	shipped, unchecked := sha(scriptSource), sha(variant)
	if shipped == unchecked {
		t.Fatal("the variant has the shipped script's SHA-1")
	}
	for _, tc := range []struct {
		name string
		opts []Option
		want string // the script of take, refund and once
	}{
		{"default", nil, shipped},
		{"WithoutACLPrecheck", []Option{WithoutACLPrecheck()}, unchecked},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := &recordingClient{Client: newUnitEnv(t).c}
			l := New(rec, tc.opts...)
			ctx := context.Background()
			a, b := Request{Key: "{u}a", Spec: perSecond3}, Request{Key: "{u}b", Spec: perSecond3}
			firstOf := func(what string, call func() error) []string {
				t.Helper()
				rec.cmds = nil
				if err := call(); err != nil {
					t.Fatalf("%s: %v", what, err)
				}
				if len(rec.cmds) == 0 || len(rec.cmds[0]) < 2 {
					t.Fatalf("%s sent %q", what, rec.cmds)
				}
				return rec.cmds[0][:2]
			}
			// The first call: EVALSHA, NOSCRIPT (miniredis starts empty),
			// then EVAL of the same script's source.
			rec.cmds = nil
			if _, err := l.AllowOrdered(ctx, a, &b); err != nil {
				t.Fatal(err)
			}
			src := scriptSource
			if tc.want == unchecked {
				src = variant
			}
			if len(rec.cmds) != 2 || rec.cmds[0][0] != "EVALSHA" || rec.cmds[0][1] != tc.want || rec.cmds[1][0] != "EVAL" || rec.cmds[1][1] != src {
				t.Errorf("first take sent %d commands, %q; want EVALSHA %s, then EVAL of its source", len(rec.cmds), heads(rec.cmds), tc.want)
			}
			for _, c := range []struct {
				what string
				call func() error
			}{
				{"take", func() error { _, err := l.AllowOrdered(ctx, a, nil); return err }},
				{"refund", func() error { return l.Refund(ctx, a, &b) }},
				{"once", func() error { _, err := l.AllowOrderedOnce(ctx, "id", a, &b); return err }},
			} {
				if got := firstOf(c.what, c.call); got[0] != "EVALSHA" || got[1] != tc.want {
					t.Errorf("%s sent %q first; want EVALSHA %s", c.what, got, tc.want)
				}
			}
			if got := firstOf("peek", func() error { _, err := l.Peek(ctx, a, &b); return err }); got[0] != "EVALSHA_RO" || got[1] != shipped {
				t.Errorf("peek sent %q first; want EVALSHA_RO %s", got, shipped)
			}
		})
	}
}

// heads is each command's name and first argument, cut short.
func heads(cmds [][]string) []string {
	var h []string
	for _, c := range cmds {
		s := strings.Join(c[:min(2, len(c))], " ")
		if len(s) > 60 {
			s = s[:60] + "…"
		}
		h = append(h, s)
	}
	return h
}
