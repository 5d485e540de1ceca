package bench

import (
	"strings"
	"testing"
	"time"
)

func TestWithLiterals(t *testing.T) {
	t.Parallel()
	var noTime *time.Time
	got, err := withLiterals(`INSERT INTO t VALUES ($1, $2, $3::timestamptz, $4, $5, $6, $10) -- $1 again`,
		[]any{"it's", "task-1", noTime, int64(42), []byte{0x01, 0xab}, true, 7, 8, 9, int32(10)},
		map[string]string{"task-1": "('e-' || :id)"})
	if err != nil {
		t.Fatal(err)
	}
	want := `INSERT INTO t VALUES ('it''s', ('e-' || :id), NULL::timestamptz, 42, '\x01ab'::bytea, true, 10) -- 'it''s' again`
	if got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
	if _, err := withLiterals("SELECT $2", []any{1}, nil); err == nil || !strings.Contains(err.Error(), "$2 without an argument") {
		t.Errorf("a missing argument: %v", err)
	}
	if _, err := withLiterals("SELECT $1", []any{struct{}{}}, nil); err == nil || !strings.Contains(err.Error(), "no SQL literal") {
		t.Errorf("an argument of unknown type: %v", err)
	}
	if got := oneLine("SELECT 1\n\tFROM  t\n"); got != "SELECT 1 FROM t" {
		t.Errorf("oneLine: %q", got)
	}
}
