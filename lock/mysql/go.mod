module github.com/herdkit/herd/lock/mysql

go 1.26.0

require (
	github.com/go-sql-driver/mysql v1.10.1
	github.com/herdkit/herd v0.1.0
	go.uber.org/goleak v1.3.0
)

require (
	filippo.io/edwards25519 v1.2.0 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/maypok86/otter/v2 v2.4.0 // indirect
	github.com/redis/go-redis/v9 v9.23.0 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/sync v0.25.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
	pgregory.net/rapid v1.3.0 // indirect
)

// Development inside herd's repository: use the herd next to this module.
// A program that imports this module from outside requires a published
// herd version instead, and has no replace directive.
replace github.com/herdkit/herd => ../..
