module github.com/herdkit/herd/lock/bench

go 1.26.0

require (
	github.com/go-sql-driver/mysql v1.10.1
	github.com/herdkit/herd v0.0.0-00010101000000-000000000000
	github.com/herdkit/herd/lock/mysql v0.0.0-00010101000000-000000000000
	github.com/herdkit/herd/lock/postgres v0.0.0-00010101000000-000000000000
	github.com/jackc/pgx/v5 v5.13.0
	github.com/redis/go-redis/v9 v9.23.0
	go.uber.org/goleak v1.3.0
)

require (
	filippo.io/edwards25519 v1.2.0 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/maypok86/otter/v2 v2.4.0 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/sync v0.25.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
	golang.org/x/text v0.41.0 // indirect
)

// Development inside herd's repository: the herd and the backends next to
// this module.
replace (
	github.com/herdkit/herd => ../..
	github.com/herdkit/herd/lock/mysql => ../mysql
	github.com/herdkit/herd/lock/postgres => ../postgres
)
