//go:build unix

package main

import "github.com/herdkit/herd/internal/redistest"

// canStartServer reports whether the bench can start a redis-server of
// its own here.
const canStartServer = true

// ownServer is a redis-server this run started.
type ownServer struct {
	addr string // 127.0.0.1:port
	pid  int
	dir  string // its temporary directory, removed by stop
	stop func() // stops the process and removes dir; safe to call twice
}

// startCluster starts a Redis Cluster of three masters from $PATH
// (redistest.StartClusterMain: free loopback ports, nothing on disk) and
// returns its addresses and the function that stops it.
func startCluster() ([]string, func(), error) {
	c, stop, err := redistest.StartClusterMain(3)
	if err != nil {
		return nil, nil, err
	}
	return c.Addrs(), stop, nil
}

// startServer starts a redis-server from $PATH. It reuses the starter of
// the tests, which is not bound to a testing.TB: redistest.StartMain picks
// a free loopback port, passes --bind 127.0.0.1 --save "" --appendonly no
// and a temporary --dir, waits until the very process it started answers
// PING (it checks INFO's process_id), and its stop function ends that
// process by its handle (SIGTERM, SIGKILL after 5 s), waits for it and
// removes the directory. On Linux the process also has a parent-death
// SIGKILL.
func startServer() (*ownServer, error) {
	s, stop, err := redistest.StartMain()
	if err != nil {
		return nil, err
	}
	return &ownServer{addr: s.Addr(), pid: s.Pid(), dir: s.Dir(), stop: stop}, nil
}
