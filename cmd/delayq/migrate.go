package main

import (
	"context"
	"fmt"

	"github.com/delayq/delayq/migrations"
)

func runMigrate(ctx context.Context, m *Main, args []string) error {
	var conn connFlags
	fs := newFlagSet(m, "migrate", "migrate [flags] up|down|status",
		"  delayq migrate up                       # create or upgrade the outbox table\n"+
			"  delayq migrate --schema jobs status     # which migrations are applied in schema jobs\n"+
			"  delayq migrate down                     # roll back the newest migration\n")
	conn.register(fs, m, true, false)
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return usagef("want one of up, down, status (see --help)")
	}
	action := fs.Arg(0)
	if action != "up" && action != "down" && action != "status" {
		return usagef("unknown action %q: want up, down or status", action)
	}
	if err := (migrations.Config{Schema: conn.schema}).Validate(); err != nil {
		return usagef("%v", err)
	}
	pool, err := conn.openPostgres(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	db := migrations.OpenDBFromPool(pool)
	defer db.Close()
	mig, err := migrations.New(db, migrations.Config{Schema: conn.schema})
	if err != nil {
		return err
	}
	switch action {
	case "up", "down":
		var res []migrations.Result
		if action == "up" {
			res, err = mig.Up(ctx)
		} else {
			res, err = mig.Down(ctx)
		}
		for _, r := range res {
			fmt.Fprintf(m.Stdout, "%s %s (%v)\n", r.Direction, r.Name, r.Duration.Round(1e5))
		}
		if err != nil {
			return err
		}
		if len(res) == 0 {
			fmt.Fprintln(m.Stdout, "nothing to do")
		}
		return nil
	default:
		st, err := mig.Status(ctx)
		if err != nil {
			return err
		}
		tw := newTable(m.Stdout, "VERSION\tNAME\tAPPLIED")
		for _, s := range st {
			applied := "pending"
			if s.Applied {
				applied = s.AppliedAt.UTC().Format("2006-01-02 15:04:05Z")
			}
			fmt.Fprintf(tw, "%d\t%s\t%s\n", s.Version, s.Name, applied)
		}
		return tw.Flush()
	}
}
