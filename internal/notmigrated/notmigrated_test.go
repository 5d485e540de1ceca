package notmigrated_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/delayq/delayq/internal/notmigrated"
)

func TestClassify(t *testing.T) {
	t.Parallel()
	pgErr := func(code, msg string) error { return &pgconn.PgError{Severity: "ERROR", Code: code, Message: msg} }
	other := errors.New("connection refused")
	for _, c := range []struct {
		name string
		err  error
		want string // "" : err unchanged
	}{
		{"outbox table", fmt.Errorf("outbox: enqueue q/x: %w", pgErr("42P01", `relation "public.delayq_outbox" does not exist`)),
			`outbox: enqueue q/x: table "public.delayq_outbox" not found (run the migrations: delayq migrate up)`},
		{"schema", fmt.Errorf("reconcile: %w", pgErr("3F000", `schema "tenant" does not exist`)),
			`reconcile: schema "tenant" not found (run the migrations: delayq migrate up)`},
		{"the user's table", pgErr("42P01", `relation "orders" does not exist`), ""},
		{"another error", fmt.Errorf("x: %w", other), ""},
		{"a unique violation", pgErr("23505", `duplicate key value violates unique constraint "delayq_outbox_pkey"`), ""},
		{"nil", nil, ""},
	} {
		got := notmigrated.Classify(c.err)
		if c.want == "" {
			if got != c.err {
				t.Errorf("%s: %v, want the error unchanged", c.name, got)
			}
			continue
		}
		if got.Error() != c.want || !errors.Is(got, notmigrated.Err) {
			t.Errorf("%s: %q, want %q wrapping Err", c.name, got, c.want)
		}
		var pe *pgconn.PgError
		if !errors.As(got, &pe) {
			t.Errorf("%s: the server's error is not kept", c.name)
		}
		if again := notmigrated.Classify(got); again != got {
			t.Errorf("%s: classified twice: %v", c.name, again)
		}
	}
	if got := notmigrated.Table(`"public"."delayq_outbox"`).Error(); got != `table "public.delayq_outbox" not found (run the migrations: delayq migrate up)` {
		t.Errorf("Table: %q", got)
	}
}
