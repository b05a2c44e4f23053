package mysql_test

import (
	"context"
	"database/sql"
	"errors"
	"log"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/herdkit/herd"
	herdmysql "github.com/herdkit/herd/lock/mysql"
)

// A scheduled job that one instance of a fleet runs, writing its result
// through a fenced upsert. (Compiled, not run: it needs a server.)
func Example() {
	ctx := context.Background()
	cfg, err := mysql.ParseDSN("app:secret@tcp(db.internal:3306)/app")
	if err != nil {
		log.Fatal(err)
	}
	db, err := sql.Open("mysql", cfg.FormatDSN()) // the application's own pool
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()

	locks := herdmysql.New(cfg, nil)
	defer locks.Close()
	lease, err := locks.TryAcquire(ctx, "nightly-report", 30*time.Second)
	if errors.Is(err, herd.ErrLeaseHeld) {
		return // another instance runs it
	}
	if err != nil {
		log.Fatal(err)
	}
	defer lease.Release(ctx)
	lease.KeepAlive(10 * time.Minute) // renew until Release; 10 minutes caps the whole holding (not an interval)

	report := "..." // the work, which stops when lease.Lost() closes
	err = herdmysql.FencedTable{Table: "reports"}.Upsert(ctx, db, "2026-12-01", lease.Token(), map[string]any{"body": report})
	if errors.Is(err, herd.ErrFenced) {
		log.Print("a newer holder wrote the report; nothing changed")
	}
}
