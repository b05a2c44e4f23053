// Package lockopt holds the checks that the lock backends (lock/postgres,
// lock/mysql, lock/etcd, lock/zookeeper) make of their options and of a
// lease's arguments: options that must not be negative, whose violation
// is a programming error (a panic in New), and the range of lease
// lengths a backend accepts ([herd.ErrInvalidTTL]).
package lockopt

import (
	"fmt"
	"time"

	"github.com/herdkit/herd"
)

// NonNegative panics when one of the durations, named by their Options
// field, is negative: "pkg: Options.Name is -1ns; it must be 0 (the
// default) or more".
func NonNegative(pkg string, durations map[string]time.Duration) {
	for name, d := range durations {
		if d < 0 {
			panic(fmt.Sprintf("%s: Options.%s is %v; it must be 0 (the default) or more", pkg, name, d))
		}
	}
}

// Count returns n, the Options field name of package pkg, or def when n
// is 0; it panics when n is negative.
func Count(pkg, name string, n, def int) int {
	if n < 0 {
		panic(fmt.Sprintf("%s: Options.%s is %d; it must be 0 (the default) or more", pkg, name, n))
	}
	if n == 0 {
		return def
	}
	return n
}

// TTLRange is the range of lease lengths a backend accepts.
type TTLRange struct {
	Min, Max time.Duration
	// Lease names the backend's lease for the error ("a PostgreSQL
	// lease"), and Why gives the reason of the range, appended to "must be
	// between Min and Max" (", PostgreSQL's idle_session_timeout limit").
	Lease, Why string
}

// Check returns an error wrapping herd.ErrInvalidTTL when ttl is outside
// the range.
func (r TTLRange) Check(ttl time.Duration) error {
	if ttl < r.Min || ttl > r.Max {
		return fmt.Errorf("%w: %v (%s must be between %v and %v%s)", herd.ErrInvalidTTL, ttl, r.Lease, r.Min, r.Max, r.Why)
	}
	return nil
}

// Prepare checks an acquire's arguments: the key (herd.CheckLockKey), then
// the ttl.
func (r TTLRange) Prepare(key string, ttl time.Duration) error {
	if err := herd.CheckLockKey(key); err != nil {
		return err
	}
	return r.Check(ttl)
}
