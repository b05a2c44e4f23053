// Command walk lists the files of the herd package that one cold Get and
// one hit run code in, in a process that has already served another key
// (so one-time setup is not counted): a measure of how far a reader must
// walk to follow a request. It runs against an embedded Redis and needs a
// binary built with coverage of the herd package:
//
//	go build -cover -covermode=atomic -coverpkg=github.com/herdkit/herd,github.com/herdkit/herd/internal/walk -o /tmp/walk ./internal/walk && /tmp/walk
//
// Code that herd's own goroutines run meanwhile (the pub/sub reader, a
// shared read) counts too: it is part of the request's path.
package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/coverage"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/herdkit/herd"
	"github.com/redis/go-redis/v9"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "walk:", err)
		os.Exit(1)
	}
}

func run() error {
	mr, err := miniredis.Run()
	if err != nil {
		return err
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	c := herd.New(rdb, nil)
	defer c.Close()
	ctx := context.Background()
	load := func(context.Context) ([]byte, error) { return []byte("v"), nil }
	if _, err := c.Get(ctx, "warm", time.Minute, load); err != nil { // connections, scripts, pub/sub
		return err
	}
	if _, err := c.Get(ctx, "warm", time.Minute, load); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp("", "herd-walk")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	for _, step := range []struct {
		name string
		key  string
	}{{"cold Get", "cold"}, {"hit", "cold"}} {
		time.Sleep(50 * time.Millisecond) // the previous step's goroutines settle
		if err := coverage.ClearCounters(); err != nil {
			return fmt.Errorf("%w (build it as its doc says)", err)
		}
		if _, err := c.Get(ctx, step.key, time.Minute, load); err != nil {
			return err
		}
		files, err := covered(tmp, step.name)
		if err != nil {
			return err
		}
		fmt.Printf("%s: %d files: %s\n", step.name, len(files), strings.Join(files, " "))
	}
	return nil
}

// covered writes the counters to a directory of their own and returns the
// herd package's files with a statement that ran.
func covered(tmp, name string) ([]string, error) {
	dir := filepath.Join(tmp, strings.ReplaceAll(name, " ", "-"))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	if err := coverage.WriteMetaDir(dir); err != nil {
		return nil, err
	}
	if err := coverage.WriteCountersDir(dir); err != nil {
		return nil, err
	}
	out := filepath.Join(tmp, "profile.txt")
	if b, err := exec.Command("go", "tool", "covdata", "textfmt", "-i", dir, "-o", out).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("go tool covdata: %v: %s", err, b)
	}
	f, err := os.Open(out)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	seen := map[string]bool{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// github.com/herdkit/herd/flight.go:12.3,14.5 2 1
		line := sc.Text()
		colon := strings.LastIndex(line, ":")
		sp := strings.LastIndex(line, " ")
		if colon < 0 || sp < colon {
			continue
		}
		if n, err := strconv.Atoi(line[sp+1:]); err != nil || n == 0 {
			continue
		}
		file := line[:colon]
		if filepath.Dir(file) != "github.com/herdkit/herd" {
			continue
		}
		seen[filepath.Base(file)] = true
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	files := make([]string, 0, len(seen))
	for f := range seen {
		files = append(files, f)
	}
	sort.Strings(files)
	return files, nil
}
