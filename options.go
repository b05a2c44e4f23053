package herd

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/herdkit/herd/internal/wire"
)

// LockerOptions configures a [Locker]. A nil *LockerOptions, and every zero
// field, means the documented default. Invalid values make [NewLocker]
// panic: they are programming errors, not request-time conditions. Every
// duration is at most 50 years, and a FenceTTL that is set at least 1ms.
type LockerOptions struct {
	// Prefix is the namespace of every Redis key and channel the Locker
	// uses. It must not contain '{' or '}' and is at most 64 bytes.
	// Default: "herd". A Cache and a Locker with the same prefix share
	// leases for the same user key.
	Prefix string

	// MaxWait bounds how long [Locker.Acquire] waits for a held lease to be
	// released, on top of the caller's context. Default: three times the
	// requested lease length.
	MaxWait time.Duration

	// PollMin and PollMax bound the fallback polling of [Locker.Acquire]:
	// the first poll comes after about PollMin, each further one waits
	// twice as long (with jitter) up to PollMax, and never much later than
	// the holder's lease would expire. Release notifications wake waiters
	// at once; polling only covers lost notifications and expired holders.
	// Defaults: 10ms and 250ms.
	PollMin, PollMax time.Duration

	// Observer receives the lease signals (acquired, contended, lost,
	// extended, extend failed). Default: none.
	Observer *Observer

	// KeyClass maps a key to the bounded class reported to Observer (for
	// example "report:*"). Default: "" for every key.
	KeyClass func(key string) string

	// Logger receives rare events (a lease lost), rate-limited. Default:
	// silent.
	Logger *slog.Logger

	// FenceTTL is how long a key's fencing counter stays in Redis after the
	// last lease on it. A counter that expires is re-seeded from the Redis
	// clock, so tokens keep increasing; the TTL only bounds memory for idle
	// keys. It is raised to at least twice the lease length on every
	// acquire and extend. Default: 24h.
	FenceTTL time.Duration

	// Replica wait (failover safety). After every script that advances a
	// key's fence (a lease acquire, a rebuild's commit, Set, Invalidate)
	// and after a lease extend, herd sends WAIT on the same connection, in
	// the same round trip, and counts the write as done only when
	// ReplicaAcks replicas acknowledged it within ReplicaTimeout. A
	// failover then promotes a replica that has the write (Sentinel
	// prefers the most up-to-date replica), so no fencing token is issued
	// twice and no acknowledged write is undone.
	//
	// ReplicaAcks 0 (the default) waits for every replica this process
	// (any of its Caches, Lockers and FencedStores) saw attached to the
	// master in the last minute, and does not wait on a master with none.
	// herd reads INFO replication about once a second, before the write it
	// precedes; the count starts afresh when the master changes (a new
	// replication id), and a process that never saw the master learns
	// what is attached when it first writes. The Redis user must be
	// allowed INFO (-@dangerous removes it): a master whose replicas
	// cannot be counted makes a Locker's (and FencedStore's) every write
	// that would wait fail with [ErrNotReplicated] and an error that says
	// so, and a Cache's wait for none (logged once); set ReplicaAcks for
	// such a user. So a deposed
	// master during a failover, whose replicas are leaving it for the new
	// master, refuses writes with [ErrNotReplicated] instead of
	// acknowledging writes that only a departing replica has. The cost: for
	// a minute after a replica leaves for good (or while one is attached
	// but stalled), this process's writes to that master are refused; a
	// process started after the replica left does not refuse. The limit: a
	// process that first meets a deposed master after its replicas left
	// does not wait (Redis's min-replicas-to-write closes that on the
	// server). A positive ReplicaAcks waits for that many replicas always;
	// -1 never waits (the behaviour before replica waits: fast, unsafe
	// across failover). ReplicaTimeout bounds each WAIT. Default: 250ms,
	// cut to half the client's ReadTimeout (a WAIT reply the client gives
	// up on fails the write before it); a ReplicaTimeout at or above the
	// ReadTimeout panics.
	//
	// When too few replicas acknowledge: an acquire returns an error
	// wrapping [ErrNotReplicated] and hands out no lease (fail-closed; the
	// lease is released on a best-effort basis); an extend returns it and
	// leaves the lease's validity where it was; Set and Invalidate return
	// it (the write may or may not survive a failover: retry); a Cache
	// miss loads locally (that miss only: a refusal is not a Redis outage,
	// and the breaker does not count it), and a commit is reported as
	// stored on the master, not confirmed on its replicas
	// ([CommitUnreplicated]).
	ReplicaAcks    int
	ReplicaTimeout time.Duration
}

// lockerConfig is LockerOptions with every default applied.
type lockerConfig struct {
	sig              *signals
	prefix           string
	maxWait          time.Duration // 0: 3 × ttl
	pollMin, pollMax time.Duration
	fenceTTL         time.Duration
	repl             *replicaWait
}

func (o *LockerOptions) resolve() lockerConfig {
	var in LockerOptions
	if o != nil {
		in = *o
	}
	c := lockerConfig{
		prefix:   in.Prefix,
		maxWait:  in.MaxWait,
		pollMin:  in.PollMin,
		pollMax:  in.PollMax,
		fenceTTL: in.FenceTTL,
	}
	if c.prefix == "" {
		c.prefix = DefaultPrefix
	}
	wire.CheckPrefix(c.prefix)
	for name, d := range map[string]time.Duration{
		"MaxWait": c.maxWait, "PollMin": c.pollMin, "PollMax": c.pollMax, "FenceTTL": c.fenceTTL,
	} {
		checkOption("LockerOptions."+name, d, 0)
	}
	if c.fenceTTL != 0 {
		checkOption("LockerOptions.FenceTTL", c.fenceTTL, time.Millisecond)
	}
	if c.pollMin == 0 {
		c.pollMin = 10 * time.Millisecond
	}
	if c.pollMax == 0 {
		c.pollMax = 250 * time.Millisecond
	}
	if c.pollMax < c.pollMin {
		panic(fmt.Sprintf("herd: LockerOptions.PollMax (%v) is below PollMin (%v)", c.pollMax, c.pollMin))
	}
	if c.fenceTTL == 0 {
		c.fenceTTL = 24 * time.Hour
	}
	c.sig = newSignals(in.Observer, in.KeyClass, in.Logger)
	c.repl = resolveReplicaWait("LockerOptions", in.ReplicaAcks, in.ReplicaTimeout)
	return c
}

// resolveReplicaWait validates the replica wait options (kept apart from
// the other options' validation).
func resolveReplicaWait(owner string, acks int, timeout time.Duration) *replicaWait {
	if acks < -1 {
		panic(fmt.Sprintf("herd: %s.ReplicaAcks is %d (must be -1, 0 or a number of replicas)", owner, acks))
	}
	if timeout < 0 {
		panic(fmt.Sprintf("herd: %s.ReplicaTimeout is negative (%v)", owner, timeout))
	}
	explicit := timeout != 0
	if timeout == 0 {
		timeout = defaultReplicaTimeout
	}
	if timeout < time.Millisecond {
		panic(fmt.Sprintf("herd: %s.ReplicaTimeout %v is below the millisecond WAIT counts in", owner, timeout))
	}
	w := newReplicaWait(acks, timeout)
	w.explicit, w.owner = explicit, owner
	w.strict = true // the Cache relaxes its own (see replicaWait)
	return w
}

// The durations herd accepts. A value's time-to-live is counted in the
// milliseconds Redis counts in; a lease also loses a clock-drift allowance
// (see drift) and must keep enough validity after it for a round trip.
// The upper bound keeps every sum herd forms (ttl + StaleFor, a fence TTL
// of twice a lease or value TTL) within a time.Duration: about 50 years.
const (
	minTTL   = time.Millisecond
	minLease = 10 * time.Millisecond // validity after drift: 7.9ms
	maxTTL   = 50 * 365 * 24 * time.Hour
)

// checkTTL rejects a value's time-to-live outside [minTTL, maxTTL].
func checkTTL(ttl time.Duration) error {
	if ttl < minTTL || ttl > maxTTL {
		return fmt.Errorf("%w: %v (a ttl must be between %v and %v, 50 years)", ErrInvalidTTL, ttl, minTTL, maxTTL)
	}
	return nil
}

// checkLeaseTTL rejects a lease length outside [minLease, maxTTL]: a
// shorter lease would be spent by its drift allowance before the acquire's
// reply could be used, so every acquire would fail as held.
func checkLeaseTTL(ttl time.Duration) error {
	if ttl < minLease || ttl > maxTTL {
		return fmt.Errorf("%w: %v (a lease must be between %v and %v, 50 years: herd subtracts 1%% + 2ms of every lease for clock drift)", ErrInvalidTTL, ttl, minLease, maxTTL)
	}
	return nil
}

// checkOption panics, as the constructors do on a programming error, when
// the option field is negative, above maxTTL, or positive and below low.
// Zero means the default and is always accepted.
func checkOption(field string, d, low time.Duration) {
	if d == 0 {
		return
	}
	if d < 0 || d < low || d > maxTTL {
		if low == 0 {
			panic(fmt.Sprintf("herd: %s is %v; it must be 0 (the default) or up to %v (50 years)", field, d, maxTTL))
		}
		panic(fmt.Sprintf("herd: %s is %v; it must be 0 (the default) or between %v and %v (50 years)", field, d, low, maxTTL))
	}
}

// Fallback says what a caller that waited its whole wait budget for
// another process's rebuild does next.
type Fallback int

const (
	// LoadLocally runs the loader in this process, without writing the
	// result (this process holds no lease, so it cannot fence the write):
	// nginx's proxy_cache_lock_timeout behaviour. It is the default.
	LoadLocally Fallback = iota
	// ServeStale returns the previous value if one is still in Redis and
	// [ErrWaitTimeout] otherwise.
	ServeStale
	// ReturnError returns [ErrWaitTimeout].
	ReturnError
)

// Options configures a [Cache]. A nil *Options, and every zero field,
// means the documented default. Invalid values make [New] panic, with a
// message naming the field and its range. Every duration is at most 50
// years; MinLease, MaxLease and DefaultLease, when set, are at least 10ms
// (a lease loses 1% + 2ms to the clock-drift allowance); a positive
// NegativeTTL, RefreshBackoff or RefreshBackoffMax is at least 1ms (Redis
// counts in milliseconds).
type Options struct {
	// Prefix namespaces every Redis key and channel, as in
	// [LockerOptions.Prefix]. Default: "herd".
	Prefix string

	// LoadTimeout bounds one run of a loader. The loader's context is
	// detached from every caller's (one caller's cancellation never fails
	// the others) and ends after LoadTimeout or MaxHold, whichever is
	// shorter, or on Close. Default: 10s.
	LoadTimeout time.Duration

	// MaxHold caps how long the watchdog keeps a rebuilding leader's lease
	// alive. Default: LoadTimeout.
	MaxHold time.Duration

	// WaitTimeout is a follower's wait budget: how long a caller waits for
	// another process's rebuild before Fallback applies. Every caller also
	// leaves when its own context ends. When set, it is a hard bound on the
	// whole call, however many waits it takes (a Begin that waited for this
	// process's Fill, handed over, then follows another's). By
	// default a follower waits for as long as the rebuild it waits for is
	// alive: twice the key's current lease length (see LeaseFactor), again
	// and again while the lease is still held (a live leader renews it
	// while it loads), up to MaxHold plus one lease in all; a leader that
	// is gone is taken over when its lease lapses. So with the defaults a
	// rebuild slower than the lease is not duplicated.
	WaitTimeout time.Duration

	// Fallback applies when a follower's wait budget is spent. Default:
	// LoadLocally.
	Fallback Fallback

	// RetryFailedLoad makes the callers that wait on a rebuild which then
	// fails (its loader returned an error or panicked) retry once with a
	// new leader instead of all getting the failure: the first of them to
	// look takes the key's lease, cluster-wide, and loads; the others wait
	// for it, and get its value, or its error (no second retry). A wave of
	// callers thus calls a failing source at most twice, one call at a
	// time, where without the retry it calls it once. The callers in the
	// failed leader's own process share its flight and get its error, as
	// does [Cache.Begin], whose callers decide for themselves (the HTTP
	// middleware retries once by calling Begin again, so the two never
	// multiply). The retry is also bounded by the wait budget: a follower
	// whose budget runs out while it waits for the retry applies Fallback
	// (with an explicit WaitTimeout and LoadLocally, that is one more call
	// of the source, from that process; the default budget follows the
	// retry's lease instead, so it does not run out while the retry is
	// alive). A loader
	// error marked with [NoShare] is retried this way whatever this says.
	//
	// Default: false, no retry: one transient failure fails every caller
	// waiting on it, in every process, and a source that is down sees one
	// call per wave. Turn it on when failures are mostly transient (a
	// reset connection, a timeout of one request) and a second call costs
	// less than failing the whole wave; leave it off when the source fails
	// under load (the retry doubles the calls exactly then) or when most
	// failures are permanent (a retry only doubles their latency).
	RetryFailedLoad bool

	// StaleFor keeps a value servable that long after its ttl ends (the
	// hard TTL in Redis is ttl + StaleFor). A stale hit returns at once and
	// starts one background refresh under the key's lease: RFC 5861
	// stale-while-revalidate, cluster-wide. If the refresh fails, the stale
	// value stays servable until the hard TTL (stale-if-error) and
	// refreshes back off (RefreshBackoff). Default: 0, no stale serving.
	// A loader that calls [SetExpiry] overrides it for its value; the HTTP
	// middleware does so for every response it stores, so for those its
	// own middleware.Options.StaleFor wins, even when it is zero.
	StaleFor time.Duration

	// EarlyRefresh is XFetch's β: a fresh hit starts a background refresh
	// with probability exp(−t/(βΔ)), t being the time left before expiry
	// and Δ the key's last rebuild time, so hot keys are rebuilt before
	// they expire. 1 is the usual value; larger refreshes earlier. The
	// lease makes it one refresh per expiry cluster-wide. Default: 0, off.
	EarlyRefresh float64

	// MaxRefreshes bounds the background refreshes this process runs at
	// once; a refresh that finds the pool full is dropped and counted
	// (Stats.RefreshesDropped) and the next stale hit tries again.
	// Default: 16.
	MaxRefreshes int

	// RefreshBackoff is the first pause after a failed background refresh,
	// shared by every process through Redis; each further consecutive
	// failure doubles it, up to RefreshBackoffMax. Defaults: 1s and 30s.
	RefreshBackoff, RefreshBackoffMax time.Duration

	// NotifyMaxBytes is the largest envelope sent inside the wake-up
	// message, saving followers a GET. Larger values are announced with a
	// marker and fetched. Default: 16 KiB; negative: never inline.
	NotifyMaxBytes int

	// MaxValueBytes is the largest value the Cache stores. A loader
	// result or Set above it gets [ErrValueTooLarge]. Default: 4 MiB.
	MaxValueBytes int

	// NegativeTTL is how long a loader's [ErrNotFound] is remembered.
	// Default: 10s. Negative: not remembered (but still shared with the
	// callers waiting on that rebuild).
	NegativeTTL time.Duration

	// TTLJitter spreads expiries: each write's time-to-live is shortened
	// by a random fraction of up to TTLJitter of it. It must be in
	// [0, 1). Default: 0.
	TTLJitter float64

	// MaxLocalLoads bounds the loaders this process runs at once outside
	// a lease: while Redis is unreachable (fail-open) and for the
	// LoadLocally fallback. Callers beyond it wait for a slot. Default: 32.
	MaxLocalLoads int

	// FailClosed makes Get return an error wrapping [ErrUnavailable] when
	// Redis cannot be reached, instead of failing open to local loads.
	FailClosed bool

	// BreakerThreshold is the number of consecutive Redis errors that open
	// the circuit: while it is open the Cache does not call Redis at all,
	// and every BreakerCooldown one call probes whether it is back.
	// Defaults: 5 and 1s.
	BreakerThreshold int
	BreakerCooldown  time.Duration

	// Lease length calibration: a key's lease is LeaseFactor × a tail
	// estimate of the recent rebuild times of its class (see KeyClass),
	// clamped to [MinLease, MaxLease], or DefaultLease while the class has
	// too little recent data. The watchdog renews the lease while the
	// rebuild runs, so its length only bounds how long a crashed leader
	// blocks the key. Defaults: 2, 250ms, 30s, 1s.
	//
	// Samples are the durations of successful rebuilds only (a value or
	// ErrNotFound; failed, timed-out and panicked loads are not): this
	// process's own, and other processes' learned from the rebuild time
	// every stored value carries, on hits, wake-ups and takeovers, each
	// rebuild counted once per process. A sample's weight halves with every
	// 32 later rebuilds of its class and with every 2 minutes. The estimate
	// is the rebuild time exceeded by at most a weight of 2 of the samples
	// (about the p96 of the last 47 rebuilds), and a class needs a total
	// weight of 5 to have one. Hence:
	//   - one or two slow rebuilds never move the lease; three in a row do;
	//   - samples, however many, stop counting on their own after at most
	//     146 later rebuilds of their class or 546 s (about 9 minutes),
	//     whichever comes first (m samples: 32·log2(m/2) rebuilds or
	//     2 min × log2(m/2));
	//   - a class without data, or rebuilt less often than about every 35 s,
	//     gets DefaultLease, never an estimate pooled from other classes.
	LeaseFactor                      float64
	MinLease, MaxLease, DefaultLease time.Duration

	// KeyClass groups keys (for example "user:*") for lease calibration,
	// so a key inherits the rebuild statistics of its class, and labels
	// them for the Observer, which never sees raw keys. It must return a
	// small, bounded set of classes. Default: for calibration every key is
	// its own class; for the Observer, "". Calibration keeps a class as a
	// 64-bit hash of its name, about 600 bytes whatever the name's length,
	// and at most 10,000 classes (then the least recently observed of a
	// random sample of 5 is dropped).
	KeyClass func(key string) string

	// Observer receives the cache's signals (lookups, loads, leases,
	// waits, commits, circuit, refreshes). Default: none, at no cost.
	Observer *Observer

	// PollMin and PollMax bound a follower's polling, the fallback when a
	// wake-up message is lost or pub/sub is down. Defaults: 10ms, 250ms.
	PollMin, PollMax time.Duration

	// Codec encodes the values of [Fetch] and [SetValue]. Default: JSON.
	Codec Codec

	// Logger receives rare events the caller does not see (a lease lost,
	// a fenced or failed commit, the breaker opening and closing, a
	// corrupt value, a failed refresh), rate-limited to one line per
	// second per kind. Default: silent.
	Logger *slog.Logger

	// ReplicaAcks and ReplicaTimeout: the replica wait after every write
	// that advances a fence, as in [LockerOptions.ReplicaAcks]. Defaults:
	// every replica the master had in the last minute, and 250ms.
	ReplicaAcks    int
	ReplicaTimeout time.Duration

	// MaxTagEntries bounds a tag's index: the keys whose values carry the
	// tag (see [SetTags]), each counted until its value expires (plus a
	// minute). A value that would be one too many is not stored
	// ([ErrTagFull]): a purge must find every value with its tag. A purge
	// reads the whole index, in pages of 1000. At most 10,000,000.
	// Default: 100,000.
	MaxTagEntries int

	// InlineHits sends a hit's GET from the caller's goroutine even when
	// the caller's ctx can end, when the caller sends its own (fewer than
	// two of the key's reads are on the wire in this process; otherwise it
	// shares the next read). go-redis hooks then see the caller's ctx
	// (tracing); without it, a Get whose ctx can end hands its GET to a
	// reader goroutine (kept between reads) so that it can leave at once,
	// which costs two goroutine wake-ups per hit (docs/cache-aside.md,
	// "What a hit costs"). The price: a caller whose ctx ends while its
	// own GET waits on a stalled Redis returns only when that GET does,
	// after at most the client's WriteTimeout and ReadTimeout (times its
	// retries). A caller that shares another caller's read still leaves at
	// once. [Cache.Peek]'s GET is sent the same way. Misses, waits for a
	// rebuild and writes still honour ctx at once. Default: false.
	InlineHits bool

	// Near turns on the near cache: a copy of fresh values in process
	// memory in front of Redis, invalidated cluster-wide on every write
	// and served only while its staleness bound holds (see [NearOptions]
	// and docs/cache-aside.md, "Near cache"). Default: off.
	Near NearOptions
}

// cacheConfig is Options with every default applied.
type cacheConfig struct {
	Options
	calib      calibration
	classLabel func(string) string // the user's KeyClass, for the Observer; nil: ""
	near       nearConfig
}

func (o *Options) resolve() cacheConfig {
	var c cacheConfig
	if o != nil {
		c.Options = *o
	}
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	wire.CheckPrefix(c.Prefix)
	// Durations that only drive local timers may be anything positive;
	// those written to Redis must be whole milliseconds' worth, and lease
	// lengths must outlast their drift allowance.
	for name, d := range map[string]time.Duration{
		"LoadTimeout": c.LoadTimeout, "MaxHold": c.MaxHold, "WaitTimeout": c.WaitTimeout,
		"BreakerCooldown": c.BreakerCooldown, "PollMin": c.PollMin, "PollMax": c.PollMax,
		"StaleFor": c.StaleFor,
	} {
		checkOption("Options."+name, d, 0)
	}
	for name, d := range map[string]time.Duration{
		"RefreshBackoff": c.RefreshBackoff, "RefreshBackoffMax": c.RefreshBackoffMax,
	} {
		checkOption("Options."+name, d, minTTL)
	}
	for name, d := range map[string]time.Duration{
		"MinLease": c.MinLease, "MaxLease": c.MaxLease, "DefaultLease": c.DefaultLease,
	} {
		checkOption("Options."+name, d, minLease)
	}
	if c.NegativeTTL > 0 {
		// Negative means "not remembered"; a positive one is stored.
		checkOption("Options.NegativeTTL", c.NegativeTTL, minTTL)
	}
	for name, n := range map[string]int{
		"MaxValueBytes": c.MaxValueBytes, "MaxLocalLoads": c.MaxLocalLoads, "BreakerThreshold": c.BreakerThreshold,
		"MaxRefreshes": c.MaxRefreshes, "MaxTagEntries": c.MaxTagEntries,
	} {
		if n < 0 {
			panic(fmt.Sprintf("herd: Options.%s is negative (%d)", name, n))
		}
	}
	if !(c.TTLJitter >= 0 && c.TTLJitter < 1) {
		panic(fmt.Sprintf("herd: Options.TTLJitter %v is outside [0, 1)", c.TTLJitter))
	}
	if !(c.EarlyRefresh >= 0 && c.EarlyRefresh <= 1e6) {
		panic(fmt.Sprintf("herd: Options.EarlyRefresh %v is not a finite β ≥ 0", c.EarlyRefresh))
	}
	if c.Fallback < LoadLocally || c.Fallback > ReturnError {
		panic(fmt.Sprintf("herd: unknown Options.Fallback %d", c.Fallback))
	}
	setDefault(&c.LoadTimeout, 10*time.Second)
	setDefault(&c.MaxHold, c.LoadTimeout)
	setDefault(&c.BreakerCooldown, time.Second)
	setDefault(&c.PollMin, 10*time.Millisecond)
	setDefault(&c.PollMax, 250*time.Millisecond)
	setDefault(&c.NegativeTTL, 10*time.Second)
	setDefault(&c.DefaultLease, time.Second)
	setDefault(&c.MinLease, min(250*time.Millisecond, c.DefaultLease))
	setDefault(&c.MaxLease, max(30*time.Second, c.DefaultLease))
	setDefault(&c.MaxValueBytes, 4<<20)
	setDefault(&c.MaxLocalLoads, 32)
	setDefault(&c.BreakerThreshold, 5)
	setDefault(&c.MaxRefreshes, 16)
	setDefault(&c.MaxTagEntries, defaultTagEntries)
	if c.MaxTagEntries > maxTagEntries {
		panic(fmt.Sprintf("herd: Options.MaxTagEntries %d is above %d", c.MaxTagEntries, maxTagEntries))
	}
	setDefault(&c.RefreshBackoff, time.Second)
	setDefault(&c.RefreshBackoffMax, max(30*time.Second, c.RefreshBackoff))
	if c.RefreshBackoffMax < c.RefreshBackoff {
		panic(fmt.Sprintf("herd: Options.RefreshBackoffMax (%v) is below RefreshBackoff (%v)", c.RefreshBackoffMax, c.RefreshBackoff))
	}
	if c.NotifyMaxBytes == 0 {
		c.NotifyMaxBytes = 16 << 10
	}
	if c.PollMax < c.PollMin {
		panic(fmt.Sprintf("herd: Options.PollMax (%v) is below PollMin (%v)", c.PollMax, c.PollMin))
	}
	if c.Codec == nil {
		c.Codec = JSON{}
	}
	c.classLabel = c.KeyClass
	if c.KeyClass == nil {
		c.KeyClass = func(key string) string { return key }
	}
	resolveReplicaWait("Options", c.ReplicaAcks, c.ReplicaTimeout) // validates
	c.near = c.Near.resolve()
	c.calib = calibration{Factor: c.LeaseFactor, Min: c.MinLease, Max: c.MaxLease, Default: c.DefaultLease}
	newCalibrator(c.calib) // panics on an invalid combination
	return c
}

func setDefault[T comparable](p *T, def T) {
	var zero T
	if *p == zero {
		*p = def
	}
}
