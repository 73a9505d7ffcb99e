package admithttp_test

import (
	"go/parser"
	"go/token"
	"os"
	"strconv"
	"strings"
	"testing"
)

// TestImportsStdlibAndAdmitOnly: the package adds nothing to an importer's
// module graph. Its files import the standard library (no dot in the first
// path element) and admit itself, nothing else.
func TestImportsStdlibAndAdmitOnly(t *testing.T) {
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	files := 0
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		files++
		f, err := parser.ParseFile(token.NewFileSet(), e.Name(), nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range f.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			first, _, _ := strings.Cut(path, "/")
			if strings.Contains(first, ".") && path != "github.com/admitkit/admit" {
				t.Errorf("%s imports %s; admithttp may import the standard library and admit only", e.Name(), path)
			}
		}
	}
	if files < 3 {
		t.Fatalf("checked %d files; the package has at least 3", files)
	}
}
