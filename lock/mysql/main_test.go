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
	"go.uber.org/goleak"
)

// Environment of the tests.
const (
	dsnEnv     = "HERD_MYSQL_DSN"     // the server's admin DSN
	requireEnv = "HERD_REQUIRE_REDIS" // 1: a missing server fails the tests (herd's CI variable for every server)
	workerEnv  = "HERD_MYSQL_WORKER"  // set when the test binary runs as a worker process
	dbEnv      = "HERD_MYSQL_DB"      // the worker's database DSN
	defaultDSN = "root@tcp(127.0.0.1:3306)/test"
)

// testDSN is the DSN of the database the tests of this run created, or ""
// with dbErr saying why there is none.
var (
	testDSN string
	dbErr   error
)

func TestMain(m *testing.M) {
	if role := os.Getenv(workerEnv); role != "" {
		os.Exit(runWorker(role))
	}
	os.Exit(run(m))
}

func run(m *testing.M) int {
	admin := os.Getenv(dsnEnv)
	if admin == "" {
		admin = defaultDSN
	}
	drop, err := createDB(admin)
	if err != nil {
		if os.Getenv(requireEnv) == "1" {
			fmt.Fprintf(os.Stderr, "MySQL or MariaDB at %s is needed (%s=1): %v\n", admin, requireEnv, err)
			return 1
		}
		dbErr = err
		return m.Run()
	}
	code := m.Run()
	if err := drop(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		if code == 0 {
			code = 1
		}
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	return code
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
		t.Skipf("no MySQL or MariaDB server: %v (set %s=1 to fail instead)", dbErr, requireEnv)
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
