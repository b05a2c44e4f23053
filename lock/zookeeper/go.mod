module github.com/herdkit/herd/lock/zookeeper

go 1.26.0

require (
	github.com/go-zookeeper/zk v1.0.4
	github.com/herdkit/herd v0.1.0
	github.com/herdkit/herd/lock/postgres v0.1.0
	github.com/jackc/pgx/v5 v5.13.0
	go.uber.org/goleak v1.3.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/maypok86/otter/v2 v2.4.0 // indirect
	github.com/redis/go-redis/v9 v9.23.0 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/sync v0.25.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
	golang.org/x/text v0.41.0 // indirect
	pgregory.net/rapid v1.3.0 // indirect
)

// Development inside herd's repository: use the herd (and, for the tests'
// fenced write, the PostgreSQL lock) next to this module. A program that
// imports this module from outside requires a published herd version
// instead, and has no replace directive.
replace github.com/herdkit/herd => ../..

replace github.com/herdkit/herd/lock/postgres => ../postgres
