//go:build !unix

package main

import "errors"

// canStartServer reports whether the bench can start a redis-server of
// its own here. internal/redistest, which starts them, needs Unix signals.
const canStartServer = false

// ownServer is a redis-server this run started; never one here.
type ownServer struct {
	addr string
	pid  int
	dir  string
	stop func()
}

func startCluster() ([]string, func(), error) {
	return nil, nil, errors.New("bench: starting a Redis Cluster needs a Unix system")
}

func startServer() (*ownServer, error) {
	return nil, errors.New("bench: starting a redis-server needs a Unix system")
}
