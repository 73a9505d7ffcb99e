// Package apifile writes a Go package's exported API as lines, one a
// name, in the manner of the Go distribution's api/ files, from the
// package's source alone: checked-in copies (api/*.txt) make every change
// to the API a reviewed diff (TestAPIFiles).
package apifile

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/parser"
	"go/printer"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Lines returns the exported API of the package in dir, sorted: its
// exported funcs, types (with their exported fields and interface
// methods), the methods of exported types, consts and vars, each a line
// starting "pkg NAME, ". Test files and files with build tags for other
// platforms are not read; the package must build from one set of files.
func Lines(dir string) ([]string, error) {
	fset := token.NewFileSet()
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var files []*ast.File
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, name), nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, err
		}
		files = append(files, f)
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("%s: no Go files", dir)
	}
	w := &writer{fset: fset, pkg: files[0].Name.Name}
	for _, f := range files {
		for _, d := range f.Decls {
			w.decl(d)
		}
	}
	slices.Sort(w.lines)
	return slices.Compact(w.lines), nil
}

type writer struct {
	fset  *token.FileSet
	pkg   string
	lines []string
}

func (w *writer) add(format string, args ...any) {
	w.lines = append(w.lines, "pkg "+w.pkg+", "+fmt.Sprintf(format, args...))
}

// expr prints a node as gofmt would, on one line.
func (w *writer) expr(n ast.Node) string {
	var b bytes.Buffer
	printer.Fprint(&b, w.fset, n)
	return strings.Join(strings.Fields(b.String()), " ")
}

func (w *writer) decl(d ast.Decl) {
	switch d := d.(type) {
	case *ast.FuncDecl:
		if !d.Name.IsExported() {
			return
		}
		sig := w.signature(d.Type)
		if d.Recv == nil {
			w.add("func %s%s", d.Name.Name, sig)
			return
		}
		recv := d.Recv.List[0].Type
		base := recv
		if s, ok := base.(*ast.StarExpr); ok {
			base = s.X
		}
		if ix, ok := base.(*ast.IndexExpr); ok {
			base = ix.X
		}
		if id, ok := base.(*ast.Ident); !ok || !id.IsExported() {
			return
		}
		w.add("method (%s) %s%s", w.expr(recv), d.Name.Name, sig)
	case *ast.GenDecl:
		for _, s := range d.Specs {
			switch s := s.(type) {
			case *ast.TypeSpec:
				w.typ(s)
			case *ast.ValueSpec:
				kind := "var"
				if d.Tok == token.CONST {
					kind = "const"
				}
				for i, n := range s.Names {
					if !n.IsExported() {
						continue
					}
					switch {
					case s.Type != nil:
						w.add("%s %s %s", kind, n.Name, w.expr(s.Type))
					case i < len(s.Values):
						w.add("%s %s = %s", kind, n.Name, w.expr(s.Values[i]))
					default: // a const in an iota block: its position is its value
						w.add("%s %s", kind, n.Name)
					}
				}
			}
		}
	}
}

func (w *writer) typ(s *ast.TypeSpec) {
	if !s.Name.IsExported() {
		return
	}
	name := s.Name.Name
	if s.TypeParams != nil {
		name += w.expr(s.TypeParams)
	}
	switch t := s.Type.(type) {
	case *ast.StructType:
		w.add("type %s struct", name)
		for _, f := range t.Fields.List {
			if len(f.Names) == 0 { // embedded
				if id, ok := ast.Unparen(f.Type).(*ast.Ident); !ok || id.IsExported() {
					w.add("type %s struct, embedded %s", name, w.expr(f.Type))
				}
				continue
			}
			for _, n := range f.Names {
				if n.IsExported() {
					w.add("type %s struct, %s %s", name, n.Name, w.expr(f.Type))
				}
			}
		}
	case *ast.InterfaceType:
		w.add("type %s interface { %s }", name, w.methods(t))
		for _, m := range t.Methods.List {
			for _, n := range m.Names {
				if n.IsExported() {
					w.add("type %s interface, %s%s", name, n.Name, w.signature(m.Type.(*ast.FuncType)))
				}
			}
		}
	default:
		eq := " "
		if s.Assign.IsValid() {
			eq = " = "
		}
		w.add("type %s%s%s", name, eq, w.expr(s.Type))
	}
}

// methods lists an interface's method names and embedded types, sorted,
// unexported ones included: a new unexported method closes the interface to
// other packages' types, which is an API change.
func (w *writer) methods(t *ast.InterfaceType) string {
	var names []string
	for _, m := range t.Methods.List {
		if len(m.Names) == 0 {
			names = append(names, w.expr(m.Type))
		}
		for _, n := range m.Names {
			names = append(names, n.Name)
		}
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}

// signature prints a func type without "func" and without parameter
// names, which are not part of the API: "(context.Context, Request) error".
func (w *writer) signature(f *ast.FuncType) string {
	unnamed := func(l *ast.FieldList) *ast.FieldList {
		if l == nil {
			return nil
		}
		out := &ast.FieldList{}
		for _, f := range l.List {
			for range max(1, len(f.Names)) {
				out.List = append(out.List, &ast.Field{Type: f.Type})
			}
		}
		return out
	}
	return strings.TrimPrefix(w.expr(&ast.FuncType{Params: unnamed(f.Params), Results: unnamed(f.Results)}), "func")
}
