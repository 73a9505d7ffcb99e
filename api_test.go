package admit_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/admitkit/admit/internal/apifile"
)

// TestAPIFiles: every public package of the repository (the root, and each
// folder outside internal/, examples/, benchmarks/ and integration/ that
// holds a library package, nested modules included) has its exported API
// in api/<path>.txt, and the code matches it line for line. A change to the
// API fails here until its file is updated, which makes it a reviewed diff
// and a line in CHANGELOG.md: ADMIT_API_UPDATE=1 go test -run TestAPIFiles .
// rewrites the files.
func TestAPIFiles(t *testing.T) {
	update := os.Getenv("ADMIT_API_UPDATE") == "1"
	dirs := publicPackages(t)
	want := map[string]bool{}
	for _, dir := range dirs {
		file := filepath.Join("api", apiFileName(dir))
		want[file] = true
		lines, err := apifile.Lines(dir)
		if err != nil {
			t.Fatal(err)
		}
		got := strings.Join(lines, "\n") + "\n"
		if update {
			if err := os.MkdirAll("api", 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(file, []byte(got), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		old, err := os.ReadFile(file)
		if err != nil {
			t.Errorf("package %s has no API file: %v; write it with ADMIT_API_UPDATE=1 go test -run TestAPIFiles .", dir, err)
			continue
		}
		if diff := cmp.Diff(strings.Split(string(old), "\n"), strings.Split(got, "\n")); diff != "" {
			t.Errorf("the exported API of %s differs from %s (-file +code):\n%s\n"+
				"If the change is meant, record it: ADMIT_API_UPDATE=1 go test -run TestAPIFiles . and a line in CHANGELOG.md", dir, file, diff)
		}
	}
	files, _ := filepath.Glob(filepath.Join("api", "*.txt"))
	for _, f := range files {
		if !want[f] {
			t.Errorf("%s names no public package of the repository: remove it", f)
		}
	}
}

// publicPackages returns the folders, relative to the root, that hold a
// public library package.
func publicPackages(t *testing.T) []string {
	t.Helper()
	var dirs []string
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		switch name := d.Name(); {
		case path == ".":
		case strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_"),
			name == "internal", name == "testdata", name == "api", name == "docs", name == "scripts",
			path == "examples", path == "benchmarks", path == "integration":
			return filepath.SkipDir
		}
		if isLibrary(t, path) {
			dirs = append(dirs, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return dirs
}

// isLibrary reports whether dir holds a non-test Go file of a package
// other than main.
func isLibrary(t *testing.T, dir string) bool {
	files, _ := filepath.Glob(filepath.Join(dir, "*.go"))
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(line, "package ") {
				return strings.TrimSpace(strings.TrimPrefix(line, "package ")) != "main"
			}
		}
	}
	return false
}

// apiFileName is the API file of the package in dir: admit.txt for the
// root, the path with "-" for "/" otherwise.
func apiFileName(dir string) string {
	if dir == "." {
		return "admit.txt"
	}
	return strings.ReplaceAll(filepath.ToSlash(dir), "/", "-") + ".txt"
}
