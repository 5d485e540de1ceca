// Package apisurface holds the test that counts the library's public API
// (issue 30 item 3): the number of exported declarations users see, with a
// limit that only goes down.
package apisurface

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// maxExported is the ratchet: the count of exported declarations in the root
// module's public packages may not grow above it. Lower it whenever the count
// drops; the target is 250 (issue 30): a name added must make room.
const maxExported = 250

// featureBudgets are the packages of the features built on the client (issues
// 33 to 36: workflows, fairness, the SQL API, several databases), each with a
// limit of its own, counted apart from the core's maxExported: the core (the
// client, the outbox, the relay and what they return) keeps issue 30's target,
// and a feature's surface is judged by what the feature needs. A package here
// that is not found fails the test, as one found above its budget does.
var featureBudgets = map[string]int{"workflow": 27}

// modulePath is the root module's import path: an alias whose target's import
// path starts with modulePath + "/internal/" names an internal type.
const modulePath = "github.com/delayq/delayq"

// skipDirs are the directories of the root module whose packages users do not
// import: internal (unimportable), the command and the examples, and the
// nested modules, which are counted on their own or not at all.
var skipDirs = map[string]bool{"internal": true, "cmd": true, "examples": true, "delayqotel": true, "testdata": true}

// knownProblems are problems tolerated while a package is being rewritten, by
// "package.Name" ("package.Type.Method" for a method); none today. The test
// fails on any other problem, and on an entry here that is no longer one.
var knownProblems = map[string]bool{}

// problem is an exported identifier without a doc comment, or an alias to an
// internal type.
type problem struct {
	key string // package.Name, or package.Type.Method
	msg string // with its position
}

// surface is what the test finds in one package.
type surface struct {
	count int
	// problems are exported identifiers without a doc comment and aliases to
	// internal types.
	problems []problem
	// names are the exported identifiers, for DELAYQ_API_LIST=1.
	names []string
}

// TestExportedSurface counts the exported declarations (top-level funcs,
// types, vars and consts, and exported methods of exported types) of every
// public package of the root module, test files excluded, and fails above
// maxExported, on an exported alias to an internal package's type, and on an
// exported identifier without a doc comment.
func TestExportedSurface(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	pkgs := publicPackages(t, root)
	if len(pkgs) < 5 {
		t.Fatalf("found %d public packages under %s: the walk is broken", len(pkgs), root)
	}
	total := 0
	var lines []string
	var problems []problem
	for _, dir := range sortedKeys(pkgs) {
		s := pkgs[dir]
		problems = append(problems, s.problems...)
		if budget, ok := featureBudgets[dir]; ok {
			t.Logf("%s (a feature package, not in the total): %d of its budget %d", dir, s.count, budget)
			if s.count > budget {
				t.Errorf("feature package %s has %d exported declarations, above its budget %d", dir, s.count, budget)
			}
			if os.Getenv("DELAYQ_API_LIST") != "" {
				t.Logf("%s: %s", dir, strings.Join(s.names, " "))
			}
			continue
		}
		total += s.count
		lines = append(lines, fmt.Sprintf("%-12s %4d", dir, s.count))
		if os.Getenv("DELAYQ_API_LIST") != "" {
			t.Logf("%s: %s", dir, strings.Join(s.names, " "))
		}
	}
	report := strings.Join(lines, "\n") + fmt.Sprintf("\n%-12s %4d (limit %d: issue 30's target)", "total", total, maxExported)
	t.Logf("exported declarations per package:\n%s", report)
	// delayqotel is a module of its own (users opt into OpenTelemetry): counted
	// apart, not against the limit.
	if otel := publicPackages(t, filepath.Join(root, "delayqotel")); len(otel) > 0 {
		t.Logf("delayqotel (its own module, not in the total): %d", otel["."].count)
	}
	for dir := range featureBudgets {
		if pkgs[dir] == nil {
			t.Errorf("featureBudgets lists %s, which is not a public package: delete the entry", dir)
		}
	}
	if total > maxExported {
		t.Errorf("%d exported declarations, above the limit %d: unexport what only the module uses, move it under internal/, or drop it\n%s", total, maxExported, report)
	}
	seen := map[string]bool{}
	for _, p := range problems {
		seen[p.key] = true
		if !knownProblems[p.key] {
			t.Error(p.msg)
		}
	}
	for k := range knownProblems {
		if !seen[k] {
			t.Errorf("knownProblems lists %s, which is no longer a problem: delete the entry", k)
		}
	}
}

// TestCountSees checks the counter on a small package written for it, so a
// broken walk cannot pass by counting nothing.
func TestCountSees(t *testing.T) {
	src := `package p

import "github.com/delayq/delayq/internal/x"

// A is documented.
type A struct{}

// M is documented.
func (A) M() {}

func (A) m() {}

type b struct{}

// N is on an unexported type: not counted.
func (b) N() {}

// Alias is an alias to an internal type.
type Alias = x.T

const (
	// C1 is documented.
	C1 = 1
	C2 = 2
	c3 = 3
)

// The group's comment documents D1 and D2.
const (
	D1 = 1
	D2 = 2
)

// V and W share this comment.
var V, W int

func F() {}
`
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "p.go", src, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	var s surface
	countFile(fset, f, &s)
	if s.count != 10 { // A, M, Alias, C1, C2, D1, D2, V, W, F
		t.Errorf("count = %d, want 10", s.count)
	}
	want := []string{"p.C2", "p.F", "p.Alias"}
	for _, w := range want {
		found := false
		for _, p := range s.problems {
			found = found || p.key == w
		}
		if !found {
			t.Errorf("no problem reported for %s; got %q", w, s.problems)
		}
	}
	if len(s.problems) != len(want) {
		t.Errorf("problems = %q, want one each for %v", s.problems, want)
	}
}

// publicPackages parses every non-test Go file of the root module outside
// skipDirs, by directory relative to root.
func publicPackages(t *testing.T, root string) map[string]*surface {
	t.Helper()
	pkgs := map[string]*surface{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			if path != root && (skipDirs[filepath.ToSlash(rel)] || strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil && path != root {
				return filepath.SkipDir // a nested module
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ParseComments)
		if err != nil {
			return err
		}
		if f.Name.Name == "main" || ignoredByBuild(f) {
			return nil
		}
		dir := filepath.ToSlash(filepath.Dir(rel))
		s := pkgs[dir]
		if s == nil {
			s = &surface{}
			pkgs[dir] = s
		}
		countFile(fset, f, s)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return pkgs
}

// ignoredByBuild reports a file that is never built (//go:build ignore).
func ignoredByBuild(f *ast.File) bool {
	for _, cg := range f.Comments {
		if cg.Pos() > f.Package {
			break
		}
		for _, c := range cg.List {
			if c.Text == "//go:build ignore" {
				return true
			}
		}
	}
	return false
}

// countFile adds f's exported declarations to s, and its problems.
func countFile(fset *token.FileSet, f *ast.File, s *surface) {
	pkg := f.Name.Name
	internalImports := map[string]bool{} // local names of internal packages
	for _, imp := range f.Imports {
		path, _ := strconv.Unquote(imp.Path.Value)
		if !strings.HasPrefix(path, modulePath+"/internal/") {
			continue
		}
		name := path[strings.LastIndex(path, "/")+1:]
		if imp.Name != nil {
			name = imp.Name.Name
		}
		internalImports[name] = true
	}
	add := func(recv string, name *ast.Ident, doc ...*ast.CommentGroup) {
		s.count++
		s.names = append(s.names, name.Name)
		for _, d := range doc {
			if d != nil && strings.TrimSpace(d.Text()) != "" {
				return
			}
		}
		key := pkg + "." + name.Name
		if recv != "" {
			key = pkg + "." + recv + "." + name.Name
		}
		s.problems = append(s.problems, problem{key, fmt.Sprintf("%s: %s has no doc comment", fset.Position(name.Pos()), key)})
	}
	for _, decl := range f.Decls {
		switch d := decl.(type) {
		case *ast.FuncDecl:
			if !d.Name.IsExported() {
				continue
			}
			recv := ""
			if d.Recv != nil {
				if recv = receiverName(d.Recv); !ast.IsExported(recv) {
					continue
				}
			}
			add(recv, d.Name, d.Doc)
		case *ast.GenDecl:
			for _, spec := range d.Specs {
				switch sp := spec.(type) {
				case *ast.TypeSpec:
					if !sp.Name.IsExported() {
						continue
					}
					add("", sp.Name, sp.Doc, d.Doc)
					if sp.Assign.IsValid() {
						if sel, ok := aliasTarget(sp.Type).(*ast.SelectorExpr); ok {
							if x, ok := sel.X.(*ast.Ident); ok && internalImports[x.Name] {
								s.problems = append(s.problems, problem{pkg + "." + sp.Name.Name, fmt.Sprintf("%s: %s.%s is an alias to the internal type %s.%s: give it a definition here or drop it", fset.Position(sp.Name.Pos()), pkg, sp.Name.Name, x.Name, sel.Sel.Name)})
							}
						}
					}
				case *ast.ValueSpec:
					for _, n := range sp.Names {
						if !n.IsExported() {
							continue
						}
						// A group's comment documents its names, as go doc shows
						// it with the block (golint's rule too).
						docs := []*ast.CommentGroup{sp.Doc, sp.Comment, d.Doc}
						add("", n, docs...)
					}
				}
			}
		}
	}
}

// aliasTarget strips an alias's type of its parentheses and generic
// instantiation: type X = p.T[int] names p.T.
func aliasTarget(e ast.Expr) ast.Expr {
	switch x := e.(type) {
	case *ast.IndexExpr:
		return x.X
	case *ast.IndexListExpr:
		return x.X
	case *ast.ParenExpr:
		return aliasTarget(x.X)
	}
	return e
}

// receiverName returns the name of a method's receiver type.
func receiverName(recv *ast.FieldList) string {
	if len(recv.List) == 0 {
		return ""
	}
	t := recv.List[0].Type
	for {
		switch x := t.(type) {
		case *ast.StarExpr:
			t = x.X
		case *ast.IndexExpr:
			t = x.X
		case *ast.IndexListExpr:
			t = x.X
		case *ast.ParenExpr:
			t = x.X
		case *ast.Ident:
			return x.Name
		default:
			return ""
		}
	}
}

func sortedKeys(m map[string]*surface) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
