package herd

import (
	"context"
	_ "embed"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/herdkit/herd/internal/wire"
)

// Inspection is what herd keeps in Redis for one key, read at one instant
// on the key's master by [Cache.Inspect]. herd's Redis names are hashes
// of the key (see "Keys" in docs/guarantees.md), so redis-cli
// shows nothing readable; this is the readable form, for debugging. A nil
// field means the thing is absent.
type Inspection struct {
	Key  string // the user key
	Name string // the Redis name of its value: PREFIX:{T}:v

	Value *InspectedValue // the stored envelope

	// Lease is the key's lease: a rebuild (or a Locker lease) in progress.
	Lease *InspectedLease

	// Fence is the key's fence counter: the last token issued (0: none).
	Fence uint64

	// RefreshFailures counts the consecutive failed refreshes that set the
	// refresh backoff; Backoff is what is left of that backoff.
	RefreshFailures int
	Backoff         time.Duration

	// Failure is the marker a failed load leaves for the followers that
	// missed its message.
	Failure *InspectedFailure

	// StoreToken is the highest token a [FencedStore] accepted for the
	// key (0: no record).
	StoreToken uint64
}

// InspectedValue is a stored value's envelope.
type InspectedValue struct {
	Bytes      int           // the payload's length
	Negative   bool          // a remembered ErrNotFound
	Pass       bool          // a pass mark ([Fill.Pass]); Reason holds its text
	Reason     string        // a pass mark's reason
	Fence      uint64        // the token of the write that stored it
	WrittenAt  time.Time     // when it was built
	FreshUntil time.Time     // the end of its fresh period
	StaleUntil time.Time     // the end of its stale window (FreshUntil without one)
	Delta      time.Duration // how long its rebuild took (Δ, used by EarlyRefresh and calibration)
	TTL        time.Duration // what is left of it in Redis
	Corrupt    bool          // the bytes are not an intact envelope (then only TTL and Bytes are set), or not bytes (Type)
	Type       string        // the Redis type of a key that is not a string at the value's name ("hash", ...); Corrupt too
}

// InspectedLease is a held lease.
type InspectedLease struct {
	Owner string        // the holder's owner id (hex)
	Token uint64        // its fencing token
	TTL   time.Duration // what is left of it
}

// InspectedFailure is a failed load's marker.
type InspectedFailure struct {
	Fence   uint64 // the token of the failed rebuild
	Message string // the error it reported
	TTL     time.Duration
}

// Inspect reads everything herd keeps in Redis for key, in one script on
// the key's master (a round trip; no lease, no load, no refresh, no
// counter): the value's envelope, the lease, the fence counter, the
// refresh backoff, the failure marker and the FencedStore record.
// Errors: [ErrInvalidKey] for an empty key, [ErrClosed] after Close, and
// Redis's, wrapped.
func (c *Cache) Inspect(ctx context.Context, key string) (*Inspection, error) {
	if c.isClosed() {
		return nil, ErrClosed
	}
	k, err := makeKeys(c.cfg.Prefix, key)
	if err != nil {
		return nil, err
	}
	r, err := sendRead(ctx, c.rdb, inspectScript, []string{k.Value, k.Lease, k.Fence, k.Failed, k.Backoff, k.Record}).Slice()
	if err != nil {
		return nil, fmt.Errorf("herd: inspect %q: %w", key, err)
	}
	if len(r) != 10 {
		return nil, fmt.Errorf("herd: inspect %q: %w: %d replies from the script, want 10", key, errBadReply, len(r))
	}
	in := &Inspection{Key: key, Name: k.Value}
	switch v := r[0].(type) {
	case string:
		in.Value = inspectValue([]byte(v), pttl(r[1]))
	case []any: // a key of another type at the value's name
		typ, _ := v[0].(string)
		in.Value = &InspectedValue{TTL: pttl(r[1]), Corrupt: true, Type: typ}
	}
	if s, ok := r[2].(string); ok {
		owner, tok, _ := strings.Cut(s, ":")
		t, _ := strconv.ParseUint(tok, 10, 64)
		in.Lease = &InspectedLease{Owner: owner, Token: t, TTL: pttl(r[3])}
	}
	in.Fence = parseUint(r[4])
	in.RefreshFailures = int(parseUint(r[5]))
	if s, ok := r[6].(string); ok {
		f, msg, _ := strings.Cut(s, "|")
		t, _ := strconv.ParseUint(f, 10, 64)
		in.Failure = &InspectedFailure{Fence: t, Message: msg, TTL: pttl(r[7])}
	}
	in.Backoff = max(pttl(r[8]), 0)
	in.StoreToken = parseUint(r[9])
	return in, nil
}

func inspectValue(b []byte, ttl time.Duration) *InspectedValue {
	env, ok := wire.DecodeEnvelope(b)
	if !ok {
		return &InspectedValue{Bytes: len(b), TTL: ttl, Corrupt: true}
	}
	v := &InspectedValue{
		Bytes: len(env.Payload), Negative: env.Negative, Pass: env.Pass, Fence: env.Fence,
		WrittenAt: env.WrittenAt, FreshUntil: env.SoftExp, StaleUntil: env.StaleExp,
		Delta: env.Delta, TTL: ttl,
	}
	if env.Pass {
		v.Reason, v.Bytes = string(env.Payload), 0
	}
	return v
}

// pttl converts a PTTL reply: the time left, -1 for no expiry (a key herd
// always gives one), 0 when absent.
func pttl(v any) time.Duration {
	n, _ := v.(int64)
	switch {
	case n == -1:
		return -1
	case n < 0:
		return 0
	}
	return time.Duration(n) * time.Millisecond
}

func parseUint(v any) uint64 {
	s, _ := v.(string)
	n, _ := strconv.ParseUint(s, 10, 64)
	return n
}

// String renders the inspection for a terminal, one fact per line.
func (in *Inspection) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "key:      %q\nredis:    %s\n", in.Key, in.Name)
	switch v := in.Value; {
	case v == nil:
		b.WriteString("value:    none\n")
	case v.Type != "":
		fmt.Fprintf(&b, "value:    a Redis %s, not herd's (read as a miss), ttl %v\n", v.Type, v.TTL)
	case v.Corrupt:
		fmt.Fprintf(&b, "value:    %d bytes that are not an intact envelope (read as a miss), ttl %v\n", v.Bytes, v.TTL)
	default:
		kind := fmt.Sprintf("%d bytes", v.Bytes)
		if v.Negative {
			kind = "negative entry (ErrNotFound)"
		}
		if v.Pass {
			kind = fmt.Sprintf("pass mark (%q)", v.Reason)
		}
		fmt.Fprintf(&b, "value:    %s, fence %d\n", kind, v.Fence)
		fmt.Fprintf(&b, "          written %s, fresh until %s, stale until %s\n",
			v.WrittenAt.Format(time.RFC3339Nano), v.FreshUntil.Format(time.RFC3339Nano), v.StaleUntil.Format(time.RFC3339Nano))
		fmt.Fprintf(&b, "          rebuild took %v, ttl %v\n", v.Delta, v.TTL)
	}
	if l := in.Lease; l != nil {
		fmt.Fprintf(&b, "lease:    held by %s, token %d, ttl %v\n", l.Owner, l.Token, l.TTL)
	} else {
		b.WriteString("lease:    free\n")
	}
	fmt.Fprintf(&b, "fence:    %d\n", in.Fence)
	if in.Backoff > 0 || in.RefreshFailures > 0 {
		fmt.Fprintf(&b, "refresh:  %d failures in a row, backoff %v left\n", in.RefreshFailures, in.Backoff)
	}
	if f := in.Failure; f != nil {
		fmt.Fprintf(&b, "failure:  rebuild %d failed: %s (marker ttl %v)\n", f.Fence, f.Message, f.TTL)
	}
	if in.StoreToken > 0 {
		fmt.Fprintf(&b, "store:    FencedStore accepted token %d\n", in.StoreToken)
	}
	return b.String()
}
