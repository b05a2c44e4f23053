package herd

// FlightJoiners returns how many callers have joined the running local
// flight of key besides the one that started it (0 when none runs), for
// the tests of package herd_test that must release a loader only once
// every caller has joined.
func FlightJoiners(c *Cache, key string) int {
	c.group.mu.Lock()
	defer c.group.mu.Unlock()
	if call := c.group.m[key]; call != nil {
		return call.dups
	}
	return 0
}
