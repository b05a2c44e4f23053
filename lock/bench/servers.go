package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
)

// redisServer is one redis-server process this run started: on a free
// loopback port, without persistence, in a temporary directory.
type redisServer struct {
	addr string
	cmd  *exec.Cmd
	dir  string
	done chan struct{} // closed once the process has been reaped
}

// startRedis starts redis-server (bin, or "redis-server" from $PATH) on a
// free port of 127.0.0.1 and waits until it answers PING. A port taken
// between the look-up and the server's bind is retried on a new one.
// (herd's internal/redistest does the same for the tests, but an internal
// package cannot be imported from another module.)
func startRedis(ctx context.Context, bin string) (*redisServer, error) {
	if bin == "" {
		bin = "redis-server"
	}
	path, err := exec.LookPath(bin)
	if err != nil {
		return nil, fmt.Errorf("redis-server: %w", err)
	}
	var last error
	for range 5 {
		s, err := launchRedis(ctx, path)
		if err == nil {
			return s, nil
		}
		last = err
	}
	return nil, last
}

func launchRedis(ctx context.Context, path string) (*redisServer, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "herd-lockbench-redis-")
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(path,
		"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--daemonize", "no",
		"--dir", dir, "--logfile", filepath.Join(dir, "redis.log"))
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("redis-server: %w", err)
	}
	s := &redisServer{addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), cmd: cmd, dir: dir, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(s.done)
	}()
	if err := s.waitReady(ctx); err != nil {
		s.stop()
		return nil, err
	}
	return s, nil
}

// waitReady waits up to 10s for the server to answer PING, and fails at
// once when the process exits (its port was taken, for one).
func (s *redisServer) waitReady(ctx context.Context) error {
	c := redis.NewClient(&redis.Options{Addr: s.addr, DialTimeout: 200 * time.Millisecond, MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		pctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		err := c.Ping(pctx).Err()
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-s.done:
			log, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
			return fmt.Errorf("redis-server on %s exited: %s", s.addr, lastLine(string(log)))
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redis-server on %s: no answer to PING after 10s: %w", s.addr, err)
		}
	}
}

// stop ends the process it started, by its handle (SIGTERM, SIGKILL after
// 5s), waits for it and removes its directory.
func (s *redisServer) stop() {
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(5 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
	}
	os.RemoveAll(s.dir)
}

// client returns a new client of the server, as another process would
// have.
func (s *redisServer) client() *redis.Client {
	return redis.NewClient(&redis.Options{Addr: s.addr})
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}

// pgDatabase is a database this run created on a PostgreSQL server, with
// a random name; drop removes it.
type pgDatabase struct {
	admin string
	name  string
	conf  *pgx.ConnConfig // the new database's
}

// createPG creates a database named herd_lockbench_<random> on the server
// at admin (a connection URL to a database that exists).
func createPG(ctx context.Context, admin string) (*pgDatabase, error) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	c, err := pgx.Connect(cctx, admin)
	if err != nil {
		return nil, fmt.Errorf("postgres at %s: %w", redact(admin), err)
	}
	defer c.Close(context.Background())
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "herd_lockbench_" + hex.EncodeToString(b[:])
	if _, err := c.Exec(cctx, "CREATE DATABASE "+name); err != nil {
		return nil, fmt.Errorf("postgres: create database: %w", err)
	}
	u, err := url.Parse(admin)
	if err != nil {
		return nil, err
	}
	u.Path = "/" + name
	conf, err := pgx.ParseConfig(u.String())
	if err != nil {
		return nil, err
	}
	return &pgDatabase{admin: admin, name: name, conf: conf}, nil
}

// drop drops the database, ending any session still on it.
func (d *pgDatabase) drop() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, d.admin)
	if err != nil {
		return fmt.Errorf("drop database %s: %w", d.name, err)
	}
	defer c.Close(context.Background())
	if _, err := c.Exec(ctx, "DROP DATABASE "+d.name+" WITH (FORCE)"); err != nil {
		return fmt.Errorf("drop database %s: %w", d.name, err)
	}
	return nil
}

// redact hides a URL's password.
func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable URL)"
	}
	return u.Redacted()
}

// myDatabase is a database this run created on a MySQL or MariaDB server,
// with a random name; drop removes it.
type myDatabase struct {
	admin *mysql.Config
	name  string
	conf  *mysql.Config // the new database's
}

// quiet is the driver's logger: a Close that ends a wait with KILL QUERY
// makes the driver log the broken connection.
type quiet struct{}

func (quiet) Print(...any) {}

// createMySQL creates a database named herd_lockbench_<random> on the
// server of the DSN admin.
func createMySQL(ctx context.Context, admin string) (*myDatabase, error) {
	cfg, err := mysql.ParseDSN(admin)
	if err != nil {
		return nil, fmt.Errorf("mysql DSN: %w", err)
	}
	cfg.Logger = quiet{}
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "herd_lockbench_" + hex.EncodeToString(b[:])
	if err := execMySQL(ctx, cfg, "CREATE DATABASE "+name); err != nil {
		return nil, fmt.Errorf("mysql at %s: create database: %w", cfg.Addr, err)
	}
	conf := cfg.Clone()
	conf.DBName = name
	return &myDatabase{admin: cfg, name: name, conf: conf}, nil
}

func (d *myDatabase) drop() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := execMySQL(ctx, d.admin, "DROP DATABASE "+d.name); err != nil {
		return fmt.Errorf("drop database %s: %w", d.name, err)
	}
	return nil
}

// execMySQL runs one statement on a connection of its own.
func execMySQL(ctx context.Context, cfg *mysql.Config, stmt string) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		return err
	}
	db := sql.OpenDB(conn)
	defer db.Close()
	_, err = db.ExecContext(ctx, stmt)
	return err
}
