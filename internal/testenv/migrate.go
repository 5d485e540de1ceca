package testenv

import (
	"context"

	"github.com/delayq/delayq/migrations"
)

// migrate applies the delayq migrations to the database at url, in the default schema.
func migrate(ctx context.Context, url string) error {
	db, err := migrations.OpenDB(url)
	if err != nil {
		return err
	}
	defer db.Close()
	_, err = migrations.Up(ctx, db, migrations.Config{})
	return err
}
