package herd

import (
	"context"
	"errors"
	"strings"

	"github.com/redis/go-redis/v9"
)

// The write path. Every command herd sends that writes to Redis (the
// Cache's commits, Set, Invalidate, soft invalidation and tag writes, the
// Locker's and Redlock's acquire, extend and release, FencedStore and so
// Job records) is one of the scripts declared in scripts.go, and only the
// write path sends them: replicaWait.run, runWith and runBatch
// (replicate.go). The path owns three rules, so that a feature
// cannot get one of them wrong by writing it again:
//
//   - The replica wait. A script that writes (kind writes) is followed,
//     in the same pipeline, by a WAIT for the replicas its owner's
//     ReplicaAcks asks for; a write the caller is told is done is on them,
//     or the caller gets [ErrNotReplicated].
//   - What an error says about Redis ([classify]). Only a Redis that does
//     not answer (unreachable, timing out, or replying that it cannot
//     serve now) is an outage, which the Cache's breaker counts. An error
//     reply is an answer, and herd's own refusals (not replicated, a tag
//     index full, an invalid tag or key, a reply herd cannot read) say
//     nothing about Redis's health.
//   - The ctx hand-off (ctxcall.go): a caller whose ctx ends leaves at
//     once (leaveOnDone); the round trip already sent finishes on a
//     context the caller cannot end but Close can (endWith), so that Close
//     never waits for go-redis to retry it into a dead link.

// errKind is what an error from Redis, or from herd's handling of a
// reply, says about Redis. The kinds are ordered: an error joining
// several has the highest of theirs.
type errKind uint8

const (
	kindNone    errKind = iota // no error
	kindAnswer                 // Redis answered: redis.Nil, or an error reply such as WRONGTYPE
	kindRefusal                // herd refused: ErrNotReplicated, ErrTagFull, ErrInvalidTag, ErrInvalidKey, a reply it cannot read
	kindCtx                    // the call's context was cancelled (the caller left, or Close)
	kindDown                   // Redis did not answer, timed out, or cannot serve now: an outage
)

// errBadReply is the cause of an error for a script reply herd cannot
// read: herd's own refusal, not an outage.
var errBadReply = errors.New("herd: unexpected reply from Redis")

// errPurgeTooLong is the cause of a tag purge that gave up reading an
// index that kept growing: herd's own limit, not an outage.
var errPurgeTooLong = errors.New("herd: tag purge gave up")

// refusals are herd's own refusals (kindRefusal).
var refusals = []error{ErrNotReplicated, ErrTagFull, ErrInvalidTag, ErrInvalidKey, ErrInvalidTTL, ErrValueTooLarge, errBadReply, errPurgeTooLong}

// infraCodes are the error codes of replies that mean the server cannot
// serve right now.
var infraCodes = []string{"LOADING", "READONLY", "CLUSTERDOWN", "TRYAGAIN", "MASTERDOWN", "BUSY"}

// scriptErrorPrefix starts the reply of a script whose redis.call failed,
// before Redis 7.0: "ERR Error running script (call to f_<sha>):
// @user_script:12: @user_script: 12: -READONLY You can't write against a
// read only replica." Redis 7.0 replies with the command's own code first
// ("READONLY You can't write ... script: <sha>, on @user_script:12.").
const scriptErrorPrefix = "ERR Error running script"

// classify says what err says about Redis. It walks err's whole tree: a
// refusal that wraps a network error (a WAIT whose connection broke) is
// an outage.
func classify(err error) errKind {
	if err == nil {
		return kindNone
	}
	if err == redis.Nil {
		return kindAnswer
	}
	for _, r := range refusals {
		if err == r {
			return kindRefusal
		}
	}
	if err == context.Canceled {
		return kindCtx // the caller, or our own Close: not Redis
	}
	switch u := err.(type) {
	case interface{ Unwrap() []error }:
		k := kindNone
		for _, e := range u.Unwrap() {
			k = max(k, classify(e))
		}
		if k != kindNone {
			return k
		}
	case interface{ Unwrap() error }:
		if inner := u.Unwrap(); inner != nil {
			return classify(inner)
		}
	}
	var re redis.Error
	if errors.As(err, &re) {
		msg := re.Error()
		if strings.HasPrefix(msg, scriptErrorPrefix) {
			// The command's reply follows the last location, with or
			// without its "-".
			if i := strings.LastIndex(msg, ": "); i >= 0 {
				msg = strings.TrimPrefix(msg[i+2:], "-")
			}
		}
		for _, p := range infraCodes {
			if strings.HasPrefix(msg, p) {
				return kindDown
			}
		}
		return kindAnswer
	}
	return kindDown
}

// isInfraError reports whether err means Redis is down (kindDown): the
// one rule by which the Cache's breaker, its fail-open and Peek decide
// that Redis is unavailable.
func isInfraError(err error) bool { return classify(err) == kindDown }

// sendRead runs a script that writes nothing.
func sendRead(ctx context.Context, rdb redis.Scripter, s *script, keys []string, args ...any) *redis.Cmd {
	if s.kind != reads {
		panic("herd: sendRead of the writing script " + s.name)
	}
	return s.rs.Run(ctx, rdb, keys, args...)
}

// queueRead adds a script that writes nothing to pipe: by its hash, or
// with its body when the server lacked it (body).
func queueRead(ctx context.Context, pipe redis.Pipeliner, s *script, body bool, keys []string, args ...any) *redis.Cmd {
	if s.kind != reads {
		panic("herd: queueRead of the writing script " + s.name)
	}
	if body {
		return s.rs.Eval(ctx, pipe, keys, args...)
	}
	return s.rs.EvalSha(ctx, pipe, keys, args...)
}
