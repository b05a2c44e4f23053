package mysql

import (
	"context"
	"testing"

	"github.com/herdkit/herd/locktest"
)

// TestFencedTableDocSchema: the package doc's CREATE TABLE and ALTER
// TABLE make tables FencedTable writes, by the one equal-token rule
// (locktest.FencedTableSchema), on the machine's MariaDB.
func TestFencedTableDocSchema(t *testing.T) {
	db := testDB(t)
	locktest.FencedTableSchema(t, locktest.SchemaRig{
		DocFile:    "doc.go",
		PlainTable: "CREATE TABLE %s (id BIGINT NOT NULL PRIMARY KEY, balance BIGINT NOT NULL) ENGINE=InnoDB",
		Exec: func(ctx context.Context, stmt string) error {
			_, err := db.ExecContext(ctx, stmt)
			return err
		},
		Row: func(ctx context.Context, table string) (b, f int64, err error) {
			err = db.QueryRowContext(ctx, "SELECT balance, fence FROM "+table+" WHERE id = 1").Scan(&b, &f)
			return b, f, err
		},
		Update: func(ctx context.Context, table string, token uint64, balance int64) error {
			return FencedTable{Table: table}.Update(ctx, db, 1, token, map[string]any{"balance": balance})
		},
		Upsert: func(ctx context.Context, table string, token uint64, balance int64) error {
			return FencedTable{Table: table}.Upsert(ctx, db, 1, token, map[string]any{"balance": balance})
		},
	})
}
