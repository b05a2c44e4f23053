package herd

// Waits on conditions for the tests of package herd: instead of a sleep
// that hopes a goroutine has reached a point, a test waits (with a
// deadline) for something that says it has.

import (
	"strconv"
	"testing"
	"time"
)

// waitFlightJoiners waits until at least n callers besides the one that
// started it have joined c's running local flight of key.
func waitFlightJoiners(t testing.TB, c *Cache, key string, n int) {
	t.Helper()
	waitFor(t, 10*time.Second, strconv.Itoa(n)+" callers to join the flight of "+strconv.Quote(key), func() bool {
		return FlightJoiners(c, key) >= n
	})
}
