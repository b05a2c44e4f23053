package postgres

import (
	"testing"

	"github.com/herdkit/herd/locktest"
)

// TestFencedTableDocSchema: the package doc's CREATE TABLE and ALTER
// TABLE make tables FencedTable writes, by the one equal-token rule
// (locktest.FencedTableSchema), on the machine's PostgreSQL.
func TestFencedTableDocSchema(t *testing.T) {
	locktest.FencedTableSchema(t, locktest.SchemaRig{
		DocFile:    "doc.go",
		PlainTable: "CREATE TABLE %s (id bigint PRIMARY KEY, balance bigint NOT NULL)",
		TableRig:   tables(testConn(t)),
	})
}
