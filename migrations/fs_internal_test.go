package migrations

import (
	"github.com/delayq/delayq/internal/taskstate"
	"io/fs"
	"strings"
	"testing"
	"testing/fstest"
)

func TestRender(t *testing.T) {
	t.Parallel()
	fsys, err := render("tenant_a")
	if err != nil {
		t.Fatal(err)
	}
	files, err := fs.Glob(fsys, "*.sql")
	if err != nil || len(files) == 0 {
		t.Fatalf("Glob = %v, %v", files, err)
	}
	if err := fstest.TestFS(fsys, files...); err != nil {
		t.Fatal(err)
	}
	for _, name := range files {
		b, err := fs.ReadFile(fsys, name)
		if err != nil {
			t.Fatal(err)
		}
		s := string(b)
		if strings.Contains(s, schemaPlaceholder) {
			t.Errorf("%s still has %s", name, schemaPlaceholder)
		}
		if !strings.Contains(s, "tenant_a.delayq_") {
			t.Errorf("%s does not name a table in tenant_a (tenant_a.delayq_…)", name)
		}
		if !strings.Contains(s, "-- +goose Up") || !strings.Contains(s, "-- +goose Down") {
			t.Errorf("%s lacks an Up or a Down section", name)
		}
	}
}

// The migrations create the table the library's statements name.
func TestTableName(t *testing.T) {
	if tableName != taskstate.TableName {
		t.Errorf("migrations create %q, taskstate names %q", tableName, taskstate.TableName)
	}
}
