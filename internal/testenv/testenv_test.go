package testenv

import (
	"context"
	"testing"
)

func TestMain(m *testing.M) { Main(m) }

// TestIsolation checks that two databases of one process are separate, migrated,
// and that Redis prefixes differ.
func TestIsolation(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a, b := Postgres(t), Postgres(t)
	if _, err := a.Exec(ctx, "CREATE TABLE only_in_a (x int)"); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := b.QueryRow(ctx, "SELECT count(*) FROM pg_tables WHERE tablename = 'only_in_a'").Scan(&n); err != nil || n != 0 {
		t.Fatalf("database b sees a's table: n=%d err=%v", n, err)
	}
	if err := b.QueryRow(ctx, "SELECT count(*) FROM delayq_outbox").Scan(&n); err != nil {
		t.Fatalf("template not migrated: %v", err)
	}
	var empty bool
	pe := Pool(t, EmptyPostgresURL(t))
	if err := pe.QueryRow(ctx, "SELECT to_regclass('delayq_outbox') IS NULL").Scan(&empty); err != nil || !empty {
		t.Fatalf("empty database has the outbox: %v %v", empty, err)
	}
	r1, p1 := Redis(t)
	_, p2 := Redis(t)
	if p1 == p2 {
		t.Fatalf("prefixes collide: %q", p1)
	}
	if err := r1.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
}
