package taskstate

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/delayq/delayq/delayqtype"
)

// notStates are the string literals outside the owner spelled as a state that
// name something else, with how many times each file has one. Keep it short: a
// state is delayqtype.State (or this package's names for it).
var notStates = []struct {
	file, word string
	n          int
}{
	{"internal/dispatch/keys.go", "dead", 1},   // the dead ZSET's key suffix
	{"relay/metrics.go", "dead", 2},            // the reaper's result label (reaped as dead)
	{"internal/reconcile/kind.go", "dead", 1},  // the dead ZSET, in a probe's description
	{"delayq/worker.go", "pending", 1},         // a run's outcome: handed to the completion stages
	{"delayq/hooks.go", "cancelled", 1},        // CancelError's message
	{"cmd/delayq/main.go", "dead", 2},          // the dead command's name, and its actions named in an error line
	{"cmd/delayq/migrate.go", "pending", 1},    // a migration not applied yet
	{"internal/ui/actions.go", "cancelled", 1}, // the flash message's key after a cancel
	{"internal/ui/pages.go", "cancelled", 1},   // that message
}

// No state is spelled as a string literal outside its owners (delayqtype, which
// defines the states, and this package): every user names delayqtype.State's
// constants, so a renamed or added state cannot be missed somewhere. A literal
// that is one of the five words, whole, fails the test unless it is
//   - the value of a constant or variable declared with another named type (the
//     Redis status delayq.State, a worker Outcome: another enumeration spelled
//     alike),
//   - the key of a log attribute (logger.Info(msg, "dead", n)), or
//   - in notStates.
//
// Test files are not scanned: a test may spell what it checks.
func TestNoStateLiteralsOutsideTheOwner(t *testing.T) {
	words := map[string]bool{}
	for _, s := range delayqtype.States() {
		words[string(s)] = true
	}
	root := filepath.Join("..", "..")
	owners := map[string]bool{"delayqtype": true, "internal/taskstate": true}
	found := map[[2]string][]string{} // file, word -> positions
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if owners[rel] || rel != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "vendor") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		for _, lit := range stateLiterals(f, words) {
			w, _ := strconv.Unquote(lit.Value)
			k := [2]string{rel, w}
			found[k] = append(found[k], fset.Position(lit.Pos()).String())
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range notStates {
		k := [2]string{a.file, a.word}
		if len(found[k]) != a.n {
			t.Errorf("%s has %d literals %q, the allow-list %d: %v", a.file, len(found[k]), a.word, a.n, found[k])
		}
		delete(found, k)
	}
	for k, at := range found {
		t.Errorf("state literal %q outside the owner: use delayqtype.State's constants (or, for something that is not a state, notStates): %s",
			k[1], strings.Join(at, ", "))
	}
}

// stateLiterals returns the literals of f spelled as a state, but those declared
// with another named type and the keys of log attributes.
func stateLiterals(f *ast.File, words map[string]bool) []*ast.BasicLit {
	skip := map[*ast.BasicLit]bool{}
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.ValueSpec:
			if n.Type != nil && !isStateType(n.Type) && !isString(n.Type) {
				for _, v := range n.Values {
					if lit, ok := v.(*ast.BasicLit); ok {
						skip[lit] = true
					}
				}
			}
		case *ast.CallExpr:
			for _, i := range logKeys(n) {
				if lit, ok := n.Args[i].(*ast.BasicLit); ok {
					skip[lit] = true
				}
			}
		}
		return true
	})
	var out []*ast.BasicLit
	ast.Inspect(f, func(n ast.Node) bool {
		lit, ok := n.(*ast.BasicLit)
		if !ok || lit.Kind != token.STRING || skip[lit] {
			return true
		}
		if w, err := strconv.Unquote(lit.Value); err == nil && words[w] {
			out = append(out, lit)
		}
		return true
	})
	return out
}

// isString reports whether e is the type string, which says nothing of what a
// literal names.
func isString(e ast.Expr) bool {
	id, ok := e.(*ast.Ident)
	return ok && id.Name == "string"
}

// isStateType reports whether e names the state type: delayqtype.State, or this
// package's alias of it.
func isStateType(e ast.Expr) bool {
	sel, ok := e.(*ast.SelectorExpr)
	if !ok || sel.Sel.Name != "State" {
		return false
	}
	x, ok := sel.X.(*ast.Ident)
	return ok && (x.Name == "delayqtype" || x.Name == "taskstate")
}

// logKeys returns the indexes of call's arguments that are log attribute keys:
// those after the message of slog's Debug, Info, Warn and Error (and their
// Context forms), every other one, and those of With.
func logKeys(call *ast.CallExpr) []int {
	sel, ok := call.Fun.(*ast.SelectorExpr)
	if !ok {
		return nil
	}
	first := -1
	switch sel.Sel.Name {
	case "Debug", "Info", "Warn", "Error":
		first = 1
	case "DebugContext", "InfoContext", "WarnContext", "ErrorContext":
		first = 2
	case "With":
		first = 0
	}
	if first < 0 {
		return nil
	}
	var out []int
	for i := first; i < len(call.Args); i += 2 {
		out = append(out, i)
	}
	return out
}
