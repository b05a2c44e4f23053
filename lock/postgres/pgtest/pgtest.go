// Package pgtest gives the tests of herd's lock backends a PostgreSQL
// database of their own: [CreateDB] creates one with a random name on the
// server at $HERD_PG_URL (default: the postgres superuser on
// 127.0.0.1:5432, trust authentication) and drops it after the run, and
// [Tables] is the [locktest.TableRig] of a connection to it, for the
// conformance scenarios with fenced writes. lock/postgres's tests use it,
// and lock/etcd's and lock/zookeeper's, whose pause scenario writes
// through lock/postgres's FencedTable.
//
// It is meant for tests only.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/herdkit/herd/locktest"
	"github.com/jackc/pgx/v5"
)

// Environment of the tests.
const (
	adminEnv     = "HERD_PG_URL" // the server's admin URL
	defaultAdmin = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
)

// AdminURL is the URL the databases are created with: $HERD_PG_URL, or
// the postgres superuser on 127.0.0.1:5432.
func AdminURL() string {
	if u := os.Getenv(adminEnv); u != "" {
		return u
	}
	return defaultAdmin
}

// CreateDB creates a database named prefix and random hex digits on the
// server at admin, and returns its URL and the function that drops it
// (with FORCE, ending the sessions still on it).
func CreateDB(admin, prefix string) (string, func() error, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, admin)
	if err != nil {
		return "", nil, err
	}
	defer c.Close(context.Background())
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := prefix + hex.EncodeToString(b[:])
	if _, err := c.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		return "", nil, err
	}
	u, err := url.Parse(admin)
	if err != nil {
		return "", nil, err
	}
	u.Path = "/" + name
	return u.String(), func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, admin)
		if err != nil {
			return fmt.Errorf("drop the test database %s: %w", name, err)
		}
		defer c.Close(context.Background())
		if _, err := c.Exec(ctx, "DROP DATABASE "+name+" WITH (FORCE)"); err != nil {
			return fmt.Errorf("drop the test database %s: %w", name, err)
		}
		return nil
	}, nil
}

// Server is the [locktest.Server] of a database of the run, for
// [locktest.Main]: it creates one named prefix and random digits on the
// server at [AdminURL] and sets *dbURL to its URL, or sets *dbErr.
func Server(prefix string, dbURL *string, dbErr *error) locktest.Server {
	admin := AdminURL()
	return locktest.Server{
		Name: "PostgreSQL at " + admin,
		Err:  dbErr,
		Start: func() (func() error, error) {
			u, drop, err := CreateDB(admin, prefix)
			*dbURL = u
			return drop, err
		},
	}
}

// Conn returns a connection to the database at dbURL, closed at the end of
// the test, or skips the test when dbURL is "" (no server: dbErr says
// why; HERD_REQUIRE_REDIS=1 has failed the run in locktest.Main then).
func Conn(t testing.TB, dbURL string, dbErr error) *pgx.Conn {
	t.Helper()
	if dbURL == "" {
		locktest.Skip(t, "PostgreSQL server", dbErr)
	}
	c, err := pgx.Connect(context.Background(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

// Tables is the [locktest.TableRig] of the connection c: its statements
// and queries, and fenced writes through the FencedTable type F of
// lock/postgres (whose methods are update and upsert, passed as
// postgres.FencedTable.Update and postgres.FencedTable.Upsert with db the
// connection as a postgres.DB: this package cannot import lock/postgres,
// whose tests use it).
func Tables[F ~struct{ Table, ID, Fence string }, DB any](c *pgx.Conn, db DB,
	update, upsert func(F, context.Context, DB, any, uint64, map[string]any) error) locktest.TableRig {
	return locktest.TableRig{
		Exec: func(ctx context.Context, stmt string) error {
			_, err := c.Exec(ctx, stmt)
			return err
		},
		Query: func(ctx context.Context, query string, dst ...any) error {
			return c.QueryRow(ctx, query).Scan(dst...)
		},
		Update: func(ctx context.Context, table string, id any, token uint64, set map[string]any) error {
			return update(F{Table: table}, ctx, db, id, token, set)
		},
		Upsert: func(ctx context.Context, table string, id any, token uint64, set map[string]any) error {
			return upsert(F{Table: table}, ctx, db, id, token, set)
		},
	}
}
