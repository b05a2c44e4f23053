package mysql

import (
	"testing"

	"github.com/herdkit/herd/locktest"
)

// TestFencedTableDocSchema: the package doc's CREATE TABLE and ALTER
// TABLE make tables FencedTable writes, by the one equal-token rule
// (locktest.FencedTableSchema), on the machine's MariaDB.
func TestFencedTableDocSchema(t *testing.T) {
	locktest.FencedTableSchema(t, locktest.SchemaRig{
		DocFile:    "doc.go",
		PlainTable: "CREATE TABLE %s (id BIGINT NOT NULL PRIMARY KEY, balance BIGINT NOT NULL) ENGINE=InnoDB",
		TableRig:   tables(testDB(t)),
	})
}
