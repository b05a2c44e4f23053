package postgres

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/herdkit/herd"
	"github.com/herdkit/herd/locktest"
)

// fencedTable creates a table for FencedTable's tests: key id, a value
// column and the fence.
func fencedTable(t *testing.T) (FencedTable, func(id int) (string, int64, bool)) {
	t.Helper()
	ctx := context.Background()
	db := testConn(t)
	name := "fenced_" + strconv.FormatInt(time.Now().UnixNano(), 36)
	if _, err := db.Exec(ctx, "CREATE TABLE "+name+" (id int PRIMARY KEY, v text, fence bigint NOT NULL DEFAULT 0)"); err != nil {
		t.Fatal(err)
	}
	row := func(id int) (string, int64, bool) {
		var v string
		var fence int64
		err := db.QueryRow(ctx, "SELECT v, fence FROM "+name+" WHERE id = $1", id).Scan(&v, &fence)
		if err != nil {
			return "", 0, false
		}
		return v, fence, true
	}
	return FencedTable{Table: name}, row
}

// TestFencedTable: a write lands only with a token at least the row's
// fence; a lower token is ErrFenced and changes nothing; an equal token
// (the same holding writing again) lands; a missing row is ErrNotFound
// for Update and inserted by Upsert.
func TestFencedTable(t *testing.T) {
	ctx := context.Background()
	tbl, row := fencedTable(t)
	db := testConn(t)
	set := func(v string) map[string]any { return map[string]any{"v": v} }

	if err := tbl.Update(ctx, db, 1, 5, set("a")); !errors.Is(err, herd.ErrNotFound) || errors.Is(err, herd.ErrFenced) {
		t.Errorf("Update of a missing row: %v, want ErrNotFound only", err)
	}
	if err := tbl.Upsert(ctx, db, 1, 5, set("a")); err != nil {
		t.Fatalf("Upsert of a missing row: %v", err)
	}
	steps := []struct {
		name  string
		write func() error
		err   error
		v     string
		fence int64
	}{
		{"Update, higher token", func() error { return tbl.Update(ctx, db, 1, 7, set("b")) }, nil, "b", 7},
		{"Update, same token", func() error { return tbl.Update(ctx, db, 1, 7, set("c")) }, nil, "c", 7},
		{"Update, same token, same value", func() error { return tbl.Update(ctx, db, 1, 7, set("c")) }, nil, "c", 7},
		{"Update, lower token", func() error { return tbl.Update(ctx, db, 1, 6, set("x")) }, herd.ErrFenced, "c", 7},
		{"Upsert, lower token", func() error { return tbl.Upsert(ctx, db, 1, 3, set("x")) }, herd.ErrFenced, "c", 7},
		{"Upsert, same token", func() error { return tbl.Upsert(ctx, db, 1, 7, set("b")) }, nil, "b", 7},
		{"Upsert, higher token", func() error { return tbl.Upsert(ctx, db, 1, 9, set("d")) }, nil, "d", 9},
	}
	for _, s := range steps {
		err := s.write()
		if s.err == nil && err != nil || s.err != nil && !errors.Is(err, s.err) {
			t.Errorf("%s: %v, want %v", s.name, err, s.err)
		}
		if errors.Is(err, herd.ErrFenced) && errors.Is(err, herd.ErrNotFound) {
			t.Errorf("%s: %v is both fenced and not found", s.name, err)
		}
		if v, fence, ok := row(1); !ok || v != s.v || fence != s.fence {
			t.Errorf("after %s the row is (%q, %d, %v), want (%q, %d)", s.name, v, fence, ok, s.v, s.fence)
		}
	}
}

// TestFencedTableBadInput: invalid calls fail without touching the
// database (locktest.FencedTableBadInput).
func TestFencedTableBadInput(t *testing.T) {
	locktest.FencedTableBadInput(t, tables(testConn(t)))
}

// TestFencedTableWithLocks: tokens of two holders in turn, written through
// FencedTable: the second holder's write lands, the first's late write is
// refused (locktest.FencedTableWithLocks).
func TestFencedTableWithLocks(t *testing.T) {
	locktest.FencedTableWithLocks(t, tables(testConn(t)), newTestLocker(t, nil))
}
