package redistest

import (
	"errors"
	"fmt"
	"net"
)

// maxClusterPort is the highest port a cluster node may use: a node also
// listens on its port plus clusterBusOffset, which must be a valid port.
const (
	maxClusterPort   = 55534
	clusterBusOffset = 10000
)

// freePort returns a port on 127.0.0.1 that was free a moment ago. Another
// process may take it before redis-server binds it; callers retry on that.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("finding a free port: %w", err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	if err := l.Close(); err != nil {
		return 0, fmt.Errorf("finding a free port: %w", err)
	}
	return port, nil
}

// freeClusterPort returns a port below maxClusterPort on 127.0.0.1 that was
// free a moment ago together with its cluster bus port.
func freeClusterPort() (int, error) {
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, fmt.Errorf("finding a free port: %w", err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		if port > maxClusterPort {
			l.Close()
			continue
		}
		bus, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port+clusterBusOffset))
		if err != nil {
			l.Close()
			continue
		}
		bus.Close()
		l.Close()
		return port, nil
	}
	return 0, errors.New("finding a free port: no port with a free cluster bus port found")
}
