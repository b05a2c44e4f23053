package herd

import (
	"fmt"
	"time"
)

// LockerOptions configures a [Locker]. A nil *LockerOptions, and every zero
// field, means the documented default. Invalid values make [NewLocker]
// panic: they are programming errors, not request-time conditions.
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

	// FenceTTL is how long a key's fencing counter stays in Redis after the
	// last lease on it. A counter that expires is re-seeded from the Redis
	// clock, so tokens keep increasing; the TTL only bounds memory for idle
	// keys. It is raised to at least twice the lease length on every
	// acquire and extend. Default: 24h.
	FenceTTL time.Duration
}

// lockerConfig is LockerOptions with every default applied.
type lockerConfig struct {
	prefix           string
	maxWait          time.Duration // 0: 3 × ttl
	pollMin, pollMax time.Duration
	fenceTTL         time.Duration
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
	checkPrefix(c.prefix)
	for name, d := range map[string]time.Duration{
		"MaxWait": c.maxWait, "PollMin": c.pollMin, "PollMax": c.pollMax, "FenceTTL": c.fenceTTL,
	} {
		if d < 0 {
			panic(fmt.Sprintf("herd: LockerOptions.%s is negative (%v)", name, d))
		}
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
	return c
}

// checkTTL rejects lease lengths and TTLs Redis cannot represent.
func checkTTL(ttl time.Duration) error {
	if ttl < time.Millisecond {
		return fmt.Errorf("%w: %v (must be at least 1ms)", ErrInvalidTTL, ttl)
	}
	return nil
}
