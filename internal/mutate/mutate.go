// Package mutate applies a mutant's edits to a source file at named
// markers, so that mutation tests name the code they break instead of
// quoting it: a readability edit elsewhere in the file (comments,
// blank lines, indentation, code that no mutant touches) leaves every
// mutant applicable.
//
// A marker is a comment at the end of a line: "--@name" in Lua, "//@name"
// in Go. Each marker names one line and occurs once in its file.
package mutate

import (
	"fmt"
	"strings"
)

// An Edit changes the code at the line marked At:
//
//   - Old empty: New's lines are inserted after the marked line.
//   - Old one line: Old must occur once in the marked line's code (the
//     line without its trailing comment), and is replaced by New.
//   - Old several lines: Old's lines, trimmed, must be the code lines
//     that start at the marked line (blank and comment lines skipped,
//     trailing comments ignored); they are replaced by New's lines.
//
// Inserted and replacing lines take the marked line's indentation, plus
// their own indentation relative to New's least indented line.
type Edit struct {
	At, Old, New string
}

// Apply applies edits in order to src, whose comments start with comment
// ("--" for Lua, "//" for Go).
func Apply(src, comment string, edits ...Edit) (string, error) {
	for _, e := range edits {
		var err error
		if src, err = apply(src, comment, e); err != nil {
			return "", err
		}
	}
	return src, nil
}

func apply(src, comment string, e Edit) (string, error) {
	lines := strings.Split(src, "\n")
	marker := comment + "@" + e.At
	at := -1
	for i, l := range lines {
		if j := strings.Index(l, marker); j >= 0 && strings.TrimSpace(l[j+len(marker):]) == "" {
			if at >= 0 {
				return "", fmt.Errorf("marker %s is on lines %d and %d, want one", marker, at+1, i+1)
			}
			at = i
		}
	}
	if at < 0 {
		return "", fmt.Errorf("marker %s not found", marker)
	}
	indent := lines[at][:len(lines[at])-len(strings.TrimLeft(lines[at], " \t"))]
	switch old := strings.Trim(e.Old, "\n"); {
	case old == "":
		return join(lines[:at+1], reindent(e.New, indent), lines[at+1:]), nil
	case !strings.Contains(old, "\n"):
		code, tail := splitComment(lines[at], comment)
		if n := strings.Count(code, old); n != 1 {
			return "", fmt.Errorf("at %s: %q occurs %d times in %q, want once", marker, old, n, strings.TrimSpace(code))
		}
		return join(lines[:at], []string{strings.Replace(code, old, e.New, 1) + tail}, lines[at+1:]), nil
	default:
		want := strings.Split(old, "\n")
		end := at
		for k := 0; k < len(want); end++ {
			if end == len(lines) {
				return "", fmt.Errorf("at %s: the file ends before %q", marker, want[k])
			}
			code, _ := splitComment(lines[end], comment)
			code = strings.TrimSpace(code)
			if code == "" {
				continue
			}
			if code != strings.TrimSpace(want[k]) {
				return "", fmt.Errorf("at %s: line %d is %q, want %q", marker, end+1, code, strings.TrimSpace(want[k]))
			}
			k++
		}
		return join(lines[:at], reindent(e.New, indent), lines[end:]), nil
	}
}

// splitComment splits a line into its code and its trailing comment,
// outside of quoted strings.
func splitComment(line, comment string) (code, tail string) {
	var quote byte
	for i := 0; i < len(line); i++ {
		switch c := line[i]; {
		case quote != 0:
			if c == '\\' {
				i++
			} else if c == quote {
				quote = 0
			}
		case c == '\'' || c == '"' || c == '`':
			quote = c
		case strings.HasPrefix(line[i:], comment):
			return line[:i], line[i:]
		}
	}
	return line, ""
}

// reindent gives text's lines the indentation indent, keeping their
// indentation relative to text's least indented non-blank line.
func reindent(text, indent string) []string {
	text = strings.Trim(text, "\n")
	if text == "" {
		return nil
	}
	lines := strings.Split(text, "\n")
	least := -1
	for _, l := range lines {
		if strings.TrimSpace(l) == "" {
			continue
		}
		if n := len(l) - len(strings.TrimLeft(l, " \t")); least < 0 || n < least {
			least = n
		}
	}
	for i, l := range lines {
		if strings.TrimSpace(l) == "" {
			lines[i] = ""
			continue
		}
		lines[i] = indent + l[least:]
	}
	return lines
}

func join(parts ...[]string) string {
	var all []string
	for _, p := range parts {
		all = append(all, p...)
	}
	return strings.Join(all, "\n")
}
