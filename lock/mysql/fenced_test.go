package mysql

import (
	"context"
	"database/sql"
	"errors"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/herdkit/herd"
	"github.com/herdkit/herd/locktest"
)

var tableSeq atomic.Int64

// fencedTable creates a table for FencedTable's tests: key id, a value
// column and the fence.
func fencedTable(t *testing.T) (FencedTable, func(id int) (string, int64, bool)) {
	t.Helper()
	ctx := context.Background()
	db := testDB(t)
	name := "fenced_" + strconv.FormatInt(time.Now().UnixNano(), 36) + "_" + strconv.FormatInt(tableSeq.Add(1), 10)
	if _, err := db.ExecContext(ctx, "CREATE TABLE "+name+" (id int PRIMARY KEY, v text, fence bigint NOT NULL DEFAULT 0)"); err != nil {
		t.Fatal(err)
	}
	row := func(id int) (string, int64, bool) {
		var v string
		var fence int64
		err := db.QueryRowContext(ctx, "SELECT v, fence FROM "+name+" WHERE id = ?", id).Scan(&v, &fence)
		if err != nil {
			return "", 0, false
		}
		return v, fence, true
	}
	return FencedTable{Table: name}, row
}

// dbs returns the ways a caller may hand FencedTable its database: a
// *sql.DB, the same with clientFoundRows (which changes what MySQL counts
// as an affected row), a *sql.Conn and a *sql.Tx (committed at the end).
func dbs(t *testing.T) map[string]func(t *testing.T) (DB, func()) {
	return map[string]func(t *testing.T) (DB, func()){
		"DB": func(t *testing.T) (DB, func()) { return testDB(t), func() {} },
		"DB with clientFoundRows": func(t *testing.T) (DB, func()) {
			cfg := testConfig(t)
			cfg.ClientFoundRows = true
			conn, err := mysql.NewConnector(cfg)
			if err != nil {
				t.Fatal(err)
			}
			db := sql.OpenDB(conn)
			t.Cleanup(func() { db.Close() })
			return db, func() {}
		},
		"Conn": func(t *testing.T) (DB, func()) {
			c, err := testDB(t).Conn(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			return c, func() {}
		},
		"Tx": func(t *testing.T) (DB, func()) {
			tx, err := testDB(t).Begin()
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { tx.Rollback() })
			return tx, func() {
				if err := tx.Commit(); err != nil {
					t.Fatal(err)
				}
			}
		},
	}
}

// TestFencedTable: a write lands only with a token at least the row's
// fence; a lower token is ErrFenced and changes nothing; an equal token
// (the same holding writing again, with new values or the same ones)
// lands; a missing row is ErrNotFound for Update and inserted by Upsert.
// It holds whatever the DB is, clientFoundRows included.
func TestFencedTable(t *testing.T) {
	for name, open := range dbs(t) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			tbl, row := fencedTable(t)
			db, commit := open(t)
			set := func(v string) map[string]any { return map[string]any{"v": v} }
			type step struct {
				name  string
				write func() error
				err   error
				v     string
				fence int64
			}
			steps := []step{
				{"Update of a missing row", func() error { return tbl.Update(ctx, db, 1, 5, set("a")) }, herd.ErrNotFound, "", 0},
				{"Upsert of a missing row", func() error { return tbl.Upsert(ctx, db, 1, 5, set("a")) }, nil, "a", 5},
				{"Update, higher token", func() error { return tbl.Update(ctx, db, 1, 7, set("b")) }, nil, "b", 7},
				{"Update, same token", func() error { return tbl.Update(ctx, db, 1, 7, set("c")) }, nil, "c", 7},
				{"Update, same token, same value", func() error { return tbl.Update(ctx, db, 1, 7, set("c")) }, nil, "c", 7},
				{"Update, lower token", func() error { return tbl.Update(ctx, db, 1, 6, set("x")) }, herd.ErrFenced, "c", 7},
				{"Update, higher token, same value", func() error { return tbl.Update(ctx, db, 1, 8, set("c")) }, nil, "c", 8},
				{"Upsert, lower token", func() error { return tbl.Upsert(ctx, db, 1, 3, set("x")) }, herd.ErrFenced, "c", 8},
				{"Upsert, same token", func() error { return tbl.Upsert(ctx, db, 1, 8, set("b")) }, nil, "b", 8},
				{"Upsert, same token, same value", func() error { return tbl.Upsert(ctx, db, 1, 8, set("b")) }, nil, "b", 8},
				{"Upsert, higher token", func() error { return tbl.Upsert(ctx, db, 1, 9, set("d")) }, nil, "d", 9},
				{"Upsert, higher token, same value", func() error { return tbl.Upsert(ctx, db, 1, 10, set("d")) }, nil, "d", 10},
			}
			for _, s := range steps {
				err := s.write()
				if s.err == nil && err != nil || s.err != nil && !errors.Is(err, s.err) {
					t.Errorf("%s: %v, want %v", s.name, err, s.err)
				}
				if errors.Is(err, herd.ErrFenced) && errors.Is(err, herd.ErrNotFound) {
					t.Errorf("%s: %v is both fenced and not found", s.name, err)
				}
			}
			commit()
			if v, fence, ok := row(1); !ok || v != "d" || fence != 10 {
				t.Errorf("at the end the row is (%q, %d, %v), want (\"d\", 10)", v, fence, ok)
			}
		})
	}
}

// TestFencedTableSteps checks the row after each write (outside a
// transaction, so that another connection sees each one).
func TestFencedTableSteps(t *testing.T) {
	ctx := context.Background()
	tbl, row := fencedTable(t)
	db := testDB(t)
	set := func(v string) map[string]any { return map[string]any{"v": v} }
	if err := tbl.Upsert(ctx, db, 1, 5, set("a")); err != nil {
		t.Fatal(err)
	}
	for _, s := range []struct {
		name  string
		write func() error
		v     string
		fence int64
	}{
		{"Update, lower token", func() error { return tbl.Update(ctx, db, 1, 4, set("x")) }, "a", 5},
		{"Upsert, same token", func() error { return tbl.Upsert(ctx, db, 1, 5, set("x")) }, "x", 5},
		{"Update, same token", func() error { return tbl.Update(ctx, db, 1, 5, set("a")) }, "a", 5},
		{"Update, higher token", func() error { return tbl.Update(ctx, db, 1, 6, set("b")) }, "b", 6},
		{"Upsert, higher token", func() error { return tbl.Upsert(ctx, db, 1, 7, set("c")) }, "c", 7},
	} {
		_ = s.write()
		if v, fence, ok := row(1); !ok || v != s.v || fence != s.fence {
			t.Errorf("after %s the row is (%q, %d, %v), want (%q, %d)", s.name, v, fence, ok, s.v, s.fence)
		}
	}
}

// TestFencedTableBadInput: invalid calls fail without touching the
// database (locktest.FencedTableBadInput).
func TestFencedTableBadInput(t *testing.T) {
	locktest.FencedTableBadInput(t, tables(testDB(t)))
}

// TestFencedTableWithLocks: tokens of two holders in turn, written through
// FencedTable: the second holder's write lands, the first's late write is
// refused (locktest.FencedTableWithLocks).
func TestFencedTableWithLocks(t *testing.T) {
	locktest.FencedTableWithLocks(t, tables(testDB(t)), newTestLocker(t, nil))
}
