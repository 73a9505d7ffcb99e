package admithttp_test

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestImportsStdlibAndAdmitOnly: the package adds nothing to an importer's
// module graph. Its files, and those of internal/edge, which it shares
// with admitgrpc, import the standard library (no dot in the first path
// element), admit itself and internal/edge, nothing else.
func TestImportsStdlibAndAdmitOnly(t *testing.T) {
	allowed := map[string]bool{"github.com/admitkit/admit": true, "github.com/admitkit/admit/internal/edge": true}
	for _, dir := range []string{".", "../internal/edge"} {
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		files := 0
		for _, e := range entries {
			if !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
				continue
			}
			files++
			f, err := parser.ParseFile(token.NewFileSet(), filepath.Join(dir, e.Name()), nil, parser.ImportsOnly)
			if err != nil {
				t.Fatal(err)
			}
			for _, imp := range f.Imports {
				path, _ := strconv.Unquote(imp.Path.Value)
				first, _, _ := strings.Cut(path, "/")
				if strings.Contains(first, ".") && !allowed[path] {
					t.Errorf("%s imports %s; admithttp may import the standard library and admit only", filepath.Join(dir, e.Name()), path)
				}
			}
		}
		if files == 0 {
			t.Fatalf("checked no file in %s", dir)
		}
	}
}
