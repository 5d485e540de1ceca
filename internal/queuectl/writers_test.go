package queuectl_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestOneWriterOfRedisControls scans every Go file of the module: Redis's copy of
// the queue controls is written only by this package (its operations and
// Restore, the relay's repair). Nothing outside this package (and package delayq's
// own tests) calls a method named SetControls, and inside package delayq only
// control.go (and the script's tests) runs the ctl script; queuectl.Restore is called only by relay/reconcile (the
// relay's sync and reconcile). A caller that wrote Redis itself could write it
// before, or without, Postgres's commit.
func TestOneWriterOfRedisControls(t *testing.T) {
	t.Parallel()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("module root %s: %v", root, err)
	}
	maySet := map[string]bool{"internal/dispatch": true, "internal/queuectl": true}
	// The fairness benchmark drives the claim script alone, with no outbox and no
	// Postgres copy of the controls to keep in step: it sets a queue's cap itself.
	maySetFiles := map[string]bool{"internal/bench/fairness.go": true}
	mayRestore := map[string]bool{"internal/reconcile": true, "internal/queuectl": true}
	fset := token.NewFileSet()
	scanned := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		rel, _ := filepath.Rel(root, path)
		dir := filepath.ToSlash(filepath.Dir(rel))
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		scanned++
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.SelectorExpr:
				name := n.Sel.Name
				if name == "SetControls" && !maySet[dir] && !maySetFiles[filepath.ToSlash(rel)] {
					t.Errorf("%s: calls %s: change controls through the control operation (package control, internal/queuectl)",
						fset.Position(n.Pos()), name)
				}
				if x, ok := n.X.(*ast.Ident); ok && x.Name == "queuectl" && name == "Restore" && !mayRestore[dir] {
					t.Errorf("%s: queuectl.Restore outside the relay's repair (internal/reconcile)", fset.Position(n.Pos()))
				}
			case *ast.CallExpr:
				// Inside package delayq, the ctl script runs only in control.go (and in
				// the script's own tests).
				if id, ok := n.Fun.(*ast.Ident); ok && id.Name == "adminScript" && dir == "internal/dispatch" && len(n.Args) == 1 &&
					!strings.HasSuffix(rel, "_test.go") {
					if lit, ok := n.Args[0].(*ast.BasicLit); ok && lit.Value == `"ctl"` && filepath.Base(rel) != "control.go" {
						t.Errorf("%s: the ctl script run outside internal/dispatch/control.go", fset.Position(n.Pos()))
					}
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if scanned < 100 {
		t.Fatalf("scanned %d Go files under %s: the walk missed the module", scanned, root)
	}
}
