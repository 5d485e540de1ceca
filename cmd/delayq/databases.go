package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"slices"
	"strings"

	"github.com/delayq/delayq/internal/validate"
)

// Several outbox databases at once (docs/DESIGN.md, "Several databases"): stats
// and check take --database KEY=URL, repeated, and report each database and the
// total.

// maxDatabases bounds the --database flags of one command: each opens a pool and
// a Redis client.
const maxDatabases = 64

// errDatabaseFlag is the cause of every rejected --database value.
var errDatabaseFlag = errors.New("bad --database")

// namedDatabase is one --database KEY=URL.
type namedDatabase struct {
	key, url string
}

// databaseFlags collects the --database values as given; parseDatabases checks
// them once the command line is read, so that no value (a URL with its password)
// is echoed by the flag package's error.
type databaseFlags struct{ specs []string }

func (d *databaseFlags) String() string { return "" }

func (d *databaseFlags) Set(s string) error {
	d.specs = append(d.specs, s)
	return nil
}

// registerDatabases adds --database to fs.
func registerDatabases(fs *flagSet, d *databaseFlags) {
	fs.Var(d, "database", "`KEY=URL` of an outbox database when several feed one Redis (repeat: each database's figures and the total; "+
		"KEY as --database-key, URL as --database-url, which it replaces)")
}

// parseDatabases checks the --database values: KEY=URL each, KEY a database key
// (validate.Database) given once, URL a PostgreSQL URL. Every error wraps
// errDatabaseFlag and shows no password.
func parseDatabases(specs []string) ([]namedDatabase, error) {
	if len(specs) > maxDatabases {
		return nil, fmt.Errorf("%w: %d databases, at most %d", errDatabaseFlag, len(specs), maxDatabases)
	}
	out := make([]namedDatabase, 0, len(specs))
	for i, spec := range specs {
		key, url, ok := strings.Cut(spec, "=")
		if !ok || url == "" {
			return nil, fmt.Errorf("%w: value %d: want KEY=URL", errDatabaseFlag, i+1)
		}
		if err := validate.Database(key); err != nil {
			return nil, fmt.Errorf("%w: value %d: key: %w", errDatabaseFlag, i+1, err)
		}
		if slices.ContainsFunc(out, func(d namedDatabase) bool { return d.key == key }) {
			return nil, fmt.Errorf("%w: key %q given twice", errDatabaseFlag, key)
		}
		if _, err := parsePostgresURL(url); err != nil {
			return nil, fmt.Errorf("%w: %s: %w", errDatabaseFlag, key, err)
		}
		out = append(out, namedDatabase{key: key, url: url})
	}
	return out, nil
}

// resolveDatabases returns the databases of a command that takes --database:
// none when it was not given; otherwise the parsed list, rejecting
// --database-url and --database-key beside it (each database names its own).
func resolveDatabases(fs *flagSet, d *databaseFlags) ([]namedDatabase, error) {
	if len(d.specs) == 0 {
		return nil, nil
	}
	var clash []string
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "database-url" || f.Name == "database-key" {
			clash = append(clash, "--"+f.Name)
		}
	})
	if len(clash) > 0 {
		return nil, usagef("--database names each database's URL and key: drop %s", strings.Join(clash, " and "))
	}
	dbs, err := parseDatabases(d.specs)
	if err != nil {
		return nil, usagef("%v", err)
	}
	return dbs, nil
}

// forEachDatabase opens each database (with Redis) in turn with the command's
// other connection flags and calls f; it stops at the first error, naming the
// database.
func forEachDatabase(ctx context.Context, conn connFlags, dbs []namedDatabase, f func(key string, s *stores) error) error {
	for _, d := range dbs {
		c := conn
		c.databaseURL, c.database = d.url, d.key
		s, err := c.openStores(ctx, true)
		if err != nil {
			return fmt.Errorf("database %s: %w", d.key, err)
		}
		err = f(d.key, s)
		s.close()
		if err != nil {
			return fmt.Errorf("database %s: %w", d.key, err)
		}
	}
	return nil
}
