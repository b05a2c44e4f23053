package mysql

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/herdkit/herd"
	"github.com/herdkit/herd/locktest"
)

// Environment of the tests.
const (
	dsnEnv     = "HERD_MYSQL_DSN" // the server's admin DSN
	dbEnv      = "HERD_MYSQL_DB"  // the worker process's database DSN (see holder)
	defaultDSN = "root@tcp(127.0.0.1:3306)/test"
)

// testDSN is the DSN of the database the tests of this run created, or ""
// with dbErr saying why there is none.
var (
	testDSN string
	dbErr   error
)

func TestMain(m *testing.M) {
	if code, ok := locktest.RunWorker(holder); ok {
		os.Exit(code)
	}
	admin := os.Getenv(dsnEnv)
	if admin == "" {
		admin = defaultDSN
	}
	os.Exit(locktest.Main(m, locktest.Server{
		Name: "MySQL or MariaDB at " + admin,
		Err:  &dbErr,
		Start: func() (func() error, error) {
			return createDB(admin)
		},
	}))
}

// holder is the worker process's holder of locktest.PausedHolderFenced:
// a Locker, and the fenced table, on the database of $HERD_MYSQL_DB.
func holder(context.Context) (herd.Lock[*Lease], locktest.TableRig, func(), error) {
	db, cfg, err := openDB(os.Getenv(dbEnv)) // the data's own connections
	if err != nil {
		return nil, locktest.TableRig{}, nil, err
	}
	locks := New(cfg, nil)
	return locks, tables(db), func() { locks.Close(); db.Close() }, nil
}

// tables is the locktest.TableRig of db, with FencedTable's writes.
func tables(db *sql.DB) locktest.TableRig {
	return locktest.TableRig{
		Exec: func(ctx context.Context, stmt string) error {
			_, err := db.ExecContext(ctx, stmt)
			return err
		},
		Query: func(ctx context.Context, query string, dst ...any) error {
			return db.QueryRowContext(ctx, query).Scan(dst...)
		},
		Update: func(ctx context.Context, table string, id any, token uint64, set map[string]any) error {
			return FencedTable{Table: table}.Update(ctx, db, id, token, set)
		},
		Upsert: func(ctx context.Context, table string, id any, token uint64, set map[string]any) error {
			return FencedTable{Table: table}.Upsert(ctx, db, id, token, set)
		},
	}
}

// quiet is the driver's logger in the tests: the tests break connections
// on purpose, and the driver would log each.
type quiet struct{}

func (quiet) Print(...any) {}

// openAdmin opens a *sql.DB on the DSN dsn.
func openDB(dsn string) (*sql.DB, *mysql.Config, error) {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil, nil, err
	}
	cfg.Logger = quiet{}
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, nil, err
	}
	return sql.OpenDB(conn), cfg, nil
}

// createDB creates a database with a random name on the server at admin,
// sets testDSN to it, and returns the function that drops it.
func createDB(admin string) (func() error, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	db, cfg, err := openDB(admin)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "herd_test_" + hex.EncodeToString(b[:])
	if _, err := db.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
		return nil, err
	}
	cfg.DBName = name
	testDSN = cfg.FormatDSN()
	return func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		db, _, err := openDB(admin)
		if err != nil {
			return fmt.Errorf("drop the test database %s: %w", name, err)
		}
		defer db.Close()
		if _, err := db.ExecContext(ctx, "DROP DATABASE "+name); err != nil {
			return fmt.Errorf("drop the test database %s: %w", name, err)
		}
		return nil
	}, nil
}

// testConfig returns the connection configuration of the test database,
// or skips the test when there is no server (HERD_REQUIRE_REDIS=1 has
// failed the run in TestMain then).
func testConfig(t testing.TB) *mysql.Config {
	t.Helper()
	if testDSN == "" {
		locktest.Skip(t, "MySQL or MariaDB server", dbErr)
	}
	cfg, err := mysql.ParseDSN(testDSN)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Logger = quiet{}
	return cfg
}

// testDB returns a *sql.DB on the test database, closed at the end of the
// test.
func testDB(t testing.TB) *sql.DB {
	t.Helper()
	conn, err := mysql.NewConnector(testConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(conn)
	t.Cleanup(func() { db.Close() })
	return db
}

// newTestLocker returns a Locker on the test database, closed at the end
// of the test.
func newTestLocker(t testing.TB, opt *Options) *Locker {
	t.Helper()
	l := New(testConfig(t), opt)
	t.Cleanup(func() { l.Close() })
	return l
}

// testName returns a lock key unique to the running test.
func testName(t testing.TB) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return t.Name() + ":" + hex.EncodeToString(b[:])
}

// kill ends the session of lease's connection (KILL CONNECTION) from
// another connection.
func kill(t *testing.T, lease *Lease) {
	t.Helper()
	if _, err := testDB(t).Exec(fmt.Sprintf("KILL %d", lease.ConnectionID())); err != nil {
		t.Fatalf("KILL %d: %v", lease.ConnectionID(), err)
	}
}
