package transition_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/delayq/delayq/internal/taskstate"
)

// notOps are the owner's exported functions and methods that make no transition.
var notOps = map[string]string{
	"New":   "builds the operations",
	"Store": "hands the statements out for reads",
	// Methods of the values the operations return.
	"OK": "", "Queue": "", "Error": "", "Unwrap": "",
}

// operations returns the exported functions and methods of this package's
// non-test files.
func operations(t *testing.T) map[string]bool {
	t.Helper()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	ops := map[string]bool{}
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		src, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		f, err := parser.ParseFile(fset, name, src, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			if fn, ok := d.(*ast.FuncDecl); ok && fn.Name.IsExported() {
				if _, skip := notOps[fn.Name.Name]; !skip {
					ops[fn.Name.Name] = true
				}
			}
		}
	}
	if len(ops) < 10 {
		t.Fatalf("found %d operations: the parse missed the package", len(ops))
	}
	return ops
}

// TestOpsNamed checks the Op column of the transition table both ways: every
// name it gives is an operation of this package (or, with a dot, the
// producer's insert in package outbox), and every operation of this package
// makes a transition of the table.
func TestOpsNamed(t *testing.T) {
	t.Parallel()
	ops := operations(t)
	named := map[string]bool{}
	for _, tr := range taskstate.Transitions {
		if tr.Op == "" {
			t.Errorf("transition %s names no operation", tr.Name)
			continue
		}
		for _, op := range strings.Split(tr.Op, ", ") {
			switch {
			case strings.HasPrefix(op, "outbox.Client.") && strings.HasPrefix(tr.Name, "enqueue") &&
				tr.Name != "enqueue-waiting" && tr.Name != "enqueue-batch":
				// The producer's insert (and an insert's replace of its key's
				// row): Postgres only, in the caller's transaction, on pgx or
				// database/sql (TestOneOwnerOfTransitions).
			case strings.HasPrefix(op, "workflow.Client.") && (tr.Name == "enqueue-waiting" || tr.Name == "set-result" ||
				tr.Name == "enqueue-batch" || tr.Name == "workflow-cancel"):
				// The insert of a waiting task (package workflow): the producer's
				// insert as well, in the caller's transaction; and a handler's
				// result, in its run's transaction; a batch's insert and a workflow's
				// cancel, in the caller's transaction.
			case strings.HasPrefix(op, "trigger "):
				// Made by the trigger of a migration, in the transaction of the
				// transition that fires it: the migration must create it.
				if !triggerCreated(t, strings.TrimPrefix(op, "trigger ")) {
					t.Errorf("transition %s names %q, which no migration creates", tr.Name, op)
				}
				continue
			case !ops[op]:
				t.Errorf("transition %s names %q, which internal/transition does not define", tr.Name, op)
			}
			named[op] = true
		}
	}
	for op := range ops {
		if !named[op] {
			t.Errorf("operation %s makes no transition of taskstate.Transitions: name it in a row's Op", op)
		}
	}
}

// triggerCreated reports whether a migration creates the trigger name.
func triggerCreated(t *testing.T, name string) bool {
	t.Helper()
	files, err := filepath.Glob("../../migrations/sql/*.sql")
	if err != nil || len(files) == 0 {
		t.Fatalf("migrations: %v (%d files)", err, len(files))
	}
	for _, f := range files {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(src), "CREATE TRIGGER "+name+"\n") {
			return true
		}
	}
	return false
}
