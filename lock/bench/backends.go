package main

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/herdkit/herd"
	etcdlock "github.com/herdkit/herd/lock/etcd"
	"github.com/herdkit/herd/lock/etcd/etcdtest"
	mysqllock "github.com/herdkit/herd/lock/mysql"
	"github.com/herdkit/herd/lock/postgres"
	"github.com/herdkit/herd/lock/zookeeper"
	"github.com/herdkit/herd/lock/zookeeper/zktest"
	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// backend is one row of the benchmark: a lock style and how to deploy it.
// Adding a backend is one entry in backends, with a setup that starts (or
// connects to) its servers and returns how to open Locks on them.
type backend struct {
	name string // the -backends name and the table's row
	desc string // what it is, for -h
	// setup starts or reaches what the backend needs. The deployment it
	// returns opens any number of Locks on it and stops it at the end.
	setup func(ctx context.Context, cfg config) (*deployment, error)
}

// deployment is a backend that is up for one run.
type deployment struct {
	// open returns a new Lock on the backend's shared store, with its own
	// clients or connections, as another process would have; close stops
	// the Lock and those clients.
	open func() (lock herd.Lock[herd.LeaseHandle], close func() error, err error)
	// teardown stops what setup started (servers, a database).
	teardown func() error
}

// backends is every backend the benchmark knows, in table order.
var backends = []backend{
	{name: "locker", desc: "herd.Locker on one redis-server", setup: setupLocker},
	{name: "redlock3", desc: "herd.Redlock over 3 redis-servers", setup: setupRedlock(3)},
	{name: "redlock5", desc: "herd.Redlock over 5 redis-servers", setup: setupRedlock(5)},
	{name: "postgres", desc: "lock/postgres (advisory lock) on the server at -pg, in a database created for the run", setup: setupPostgres},
	{name: "mysql", desc: "lock/mysql (GET_LOCK) on the server at -mysql, in a database created for the run", setup: setupMySQL},
	{name: "etcd", desc: "lock/etcd on one etcd server (lock/etcd/etcdtest)", setup: setupEtcd},
	{name: "zookeeper", desc: "lock/zookeeper on one standalone ZooKeeper server (lock/zookeeper/zktest)", setup: setupZooKeeper},
}

func findBackend(name string) (backend, bool) {
	for _, b := range backends {
		if b.name == name {
			return b, true
		}
	}
	return backend{}, false
}

// startRedisServers starts n redis-servers, or none (the ones started are
// stopped) with the first error.
func startRedisServers(ctx context.Context, cfg config, n int) ([]*redisServer, func() error, error) {
	var srvs []*redisServer
	stop := func() error {
		for _, s := range srvs {
			s.stop()
		}
		return nil
	}
	for range n {
		s, err := startRedis(ctx, cfg.redisServer)
		if err != nil {
			stop()
			return nil, nil, err
		}
		srvs = append(srvs, s)
	}
	return srvs, stop, nil
}

func setupLocker(ctx context.Context, cfg config) (*deployment, error) {
	srvs, stop, err := startRedisServers(ctx, cfg, 1)
	if err != nil {
		return nil, err
	}
	return &deployment{
		open: func() (herd.Lock[herd.LeaseHandle], func() error, error) {
			rdb := srvs[0].client()
			l := herd.NewLocker(rdb, nil)
			return herd.AnyLock(l), func() error { return errors.Join(l.Close(), rdb.Close()) }, nil
		},
		teardown: stop,
	}, nil
}

func setupRedlock(n int) func(ctx context.Context, cfg config) (*deployment, error) {
	return func(ctx context.Context, cfg config) (*deployment, error) {
		srvs, stop, err := startRedisServers(ctx, cfg, n)
		if err != nil {
			return nil, err
		}
		return &deployment{
			open: func() (herd.Lock[herd.LeaseHandle], func() error, error) {
				clients := make([]redis.UniversalClient, n)
				for i, s := range srvs {
					clients[i] = s.client()
				}
				r := herd.NewRedlock(clients, nil)
				return herd.AnyLock(r), func() error {
					err := r.Close()
					for _, c := range clients {
						err = errors.Join(err, c.Close())
					}
					return err
				}, nil
			},
			teardown: stop,
		}, nil
	}
}

func setupPostgres(ctx context.Context, cfg config) (*deployment, error) {
	db, err := createPG(ctx, cfg.pgURL)
	if err != nil {
		return nil, err
	}
	return &deployment{
		open: func() (herd.Lock[herd.LeaseHandle], func() error, error) {
			l := postgres.New(db.conf, nil)
			return herd.AnyLock(l), l.Close, nil
		},
		teardown: db.drop,
	}, nil
}

func setupMySQL(ctx context.Context, cfg config) (*deployment, error) {
	db, err := createMySQL(ctx, cfg.mysqlDSN)
	if err != nil {
		return nil, err
	}
	return &deployment{
		open: func() (herd.Lock[herd.LeaseHandle], func() error, error) {
			l := mysqllock.New(db.conf, nil)
			return herd.AnyLock(l), l.Close, nil
		},
		teardown: db.drop,
	}, nil
}

func setupEtcd(ctx context.Context, cfg config) (*deployment, error) {
	dir, err := os.MkdirTemp("", "herd-lockbench-etcd-")
	if err != nil {
		return nil, err
	}
	srv, err := etcdtest.Start(dir)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return &deployment{
		open: func() (herd.Lock[herd.LeaseHandle], func() error, error) {
			cli, err := clientv3.New(clientv3.Config{Endpoints: srv.Endpoints(), Logger: zap.NewNop()})
			if err != nil {
				return nil, nil, err
			}
			l := etcdlock.New(cli, nil)
			return herd.AnyLock(l), func() error { return errors.Join(l.Close(), cli.Close()) }, nil
		},
		teardown: func() error { return errors.Join(srv.Close(), os.RemoveAll(dir)) },
	}, nil
}

func setupZooKeeper(ctx context.Context, cfg config) (*deployment, error) {
	dir, err := os.MkdirTemp("", "herd-lockbench-zk-")
	if err != nil {
		return nil, err
	}
	srv, err := zktest.Start(dir)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return &deployment{
		open: func() (herd.Lock[herd.LeaseHandle], func() error, error) {
			l := zookeeper.New([]string{srv.Addr()}, nil)
			return herd.AnyLock(l), l.Close, nil
		},
		teardown: func() error { return errors.Join(srv.Close(), os.RemoveAll(dir)) },
	}, nil
}

// names lists the backends' names.
func names() []string {
	var out []string
	for _, b := range backends {
		out = append(out, b.name)
	}
	return out
}

func unknownBackend(name string) error {
	return fmt.Errorf("unknown backend %q (known: %v)", name, names())
}
