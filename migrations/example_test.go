package migrations_test

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/delayq/delayq/migrations"
)

// Migrate the database named by DATABASE_URL, putting delayq's table in schema "jobs".
func Example() {
	ctx := context.Background()
	db, err := migrations.OpenDB(os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()

	m, err := migrations.New(db, migrations.Config{Schema: "jobs"})
	if err != nil {
		log.Fatal(err)
	}
	applied, err := m.Up(ctx)
	if err != nil {
		log.Fatal(err)
	}
	for _, r := range applied {
		fmt.Println("applied", r.Name)
	}
}
