package mutate

import (
	"strings"
	"testing"
)

const src = `local a = 1 --@one
-- a comment
if a < 2 then --@branch
  -- why
  a = a + 1 -- trailing

  return a
end
local s = '--@not-a-marker'
`

func TestApply(t *testing.T) {
	for _, tc := range []struct {
		name string
		e    Edit
		want string // a line the result must hold
		err  string
	}{
		{"substring", Edit{At: "one", Old: "1", New: "2"}, "local a = 2 --@one", ""},
		{"insert", Edit{At: "one", New: "a = 5"}, "local a = 1 --@one\na = 5\n", ""},
		{"block, comments and blanks skipped", Edit{At: "branch", Old: "if a < 2 then\na = a + 1\nreturn a", New: "if a <= 2 then\n  return a"},
			"if a <= 2 then\n  return a\nend", ""},
		{"substring not in the line", Edit{At: "one", Old: "a < 2", New: ""}, "", "occurs 0 times"},
		{"no marker", Edit{At: "none", Old: "1", New: "2"}, "", "not found"},
		{"marker in a string is no marker", Edit{At: "not-a-marker", Old: "x", New: "y"}, "", "not found"},
		{"block mismatch", Edit{At: "branch", Old: "if a < 2 then\nreturn a", New: ""}, "", "want \"return a\""},
		{"substring in a comment is not code", Edit{At: "branch", Old: "why", New: ""}, "", "occurs 0 times"},
	} {
		got, err := Apply(src, "--", tc.e)
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%s: %v, want an error containing %q", tc.name, err, tc.err)
		case tc.err == "" && (err != nil || !strings.Contains(got, tc.want)):
			t.Errorf("%s: %v\n%s\nwant it to hold %q", tc.name, err, got, tc.want)
		}
	}
}
