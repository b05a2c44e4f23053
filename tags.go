package herd

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"time"

	"github.com/herdkit/herd/internal/wire"
	"github.com/redis/go-redis/v9"
)

// Tag purges. A value may carry tags (SetTags in a loader, Fill.SetTags,
// Set with tags); InvalidateTag invalidates every value with a tag, in every
// process, with the guarantee of Invalidate: no rebuild that began before
// the purge stores its value after it.
//
// Redis names, for prefix P (H is the base64url SHA-256 of "tag\x00" and
// the tag, so a tag's names share one slot and carry no raw bytes):
//
//	P:tg      the purge generation G: every purge raises it (tagbump.lua)
//	P:{H}:tz  the tag's index: sorted set of the hash tags T of the keys
//	          whose value carries the tag, each scored by the value's
//	          expiry (the tag's server clock, ms) plus tagGrace; it expires
//	          with its longest-lived member
//	P:{H}:tp  the generation of the tag's last purge; PX purgedTTL
//
// Once the Cache has seen a tag, a rebuild reads G (G0) with its
// ACQUIRE, before its load begins. A tagged commit first runs TAGADD for
// each tag, which refuses when the tag's tp is above G0 (or, when the
// rebuild has no G0, when there is a tp at all), and else adds the key to
// the index; then the usual COMMIT, fenced by the key's counter. A purge
// raises G to g, then per tag raises tp to g and reads the index's
// members, then invalidates each of them (the fenced INVALIDATE script).
// Why a rebuild R that began before the purge P was called cannot store
// after P returned (R's G0, if it has one, is below g):
//
//   - R's TAGADD runs after P's TAGPURGE of the tag: it finds tp >= g,
//     above G0, and refuses; R does not commit.
//   - R's TAGADD runs before it: P reads R's key from the index and
//     invalidates it. R's COMMIT before that INVALIDATE is deleted by it;
//     R's COMMIT after it is fenced (INVALIDATE advanced the key's
//     counter past R's token).
//
// tp only lives purgedTTL, so the first case needs R's TAGADD to come
// within purgedTTL of P's TAGPURGE: a rebuild accepts its TAGADDs' answer
// only if it came within tagWindow (half of purgedTTL) of its ACQUIRE;
// a longer rebuild with a G0 reads G again before its TAGADDs, is refused
// if G moved (some purge ran since it began), and then needs its TAGADDs
// to answer within tagWindow of that read; one without G0 is refused.
// docs/design.md has the full argument.

// Limits on tags.
const (
	// MaxTags is the most distinct tags one value may carry.
	MaxTags = 128
	// MaxTagBytes is the longest tag, in bytes.
	MaxTagBytes = 1024
)

const (
	// tagGrace is what a member's score adds to its value's expiry: the
	// value's PX counts from when its COMMIT runs, a little after TAGADD,
	// on another server's clock, and a go-redis retry can run the COMMIT
	// again later. Far longer than any retry sequence.
	tagGrace = time.Minute
	// tagWindow bounds the time from the read of the purge generation a
	// rebuild relies on to the reply of its TAGADDs; purgedTTL, how long
	// a tag remembers its last purge, is twice that (clock rates differ).
	tagWindow = time.Minute
	purgedTTL = 2 * tagWindow
	// purgePage is the size of one page of a purge (tagpurge.lua): pages
	// go in score order, so that a failover or a restart between two of
	// them skips no member, as a ZSCAN cursor would on another server.
	purgePage = 1000
	// maxPurgePages bounds the pages of one tag's purge (an index holds
	// at most maxTagEntries members; one whose score is raised during the
	// purge may come again).
	maxPurgePages = 4*maxTagEntries/purgePage + 16
	// maxTagEntries bounds Options.MaxTagEntries.
	maxTagEntries = 10_000_000
	// defaultTagEntries is the default of Options.MaxTagEntries.
	defaultTagEntries = 100_000
)

// tagFamily holds the Redis names of one tag (internal/wire).
type tagFamily = wire.TagFamily

func makeTagKeys(prefix, tag string) tagFamily { return wire.TagKeys(prefix, tag) }

// genKey is the name of a prefix's purge generation.
func genKey(prefix string) string { return wire.GenKey(prefix) }

// checkTags validates tags and returns them sorted, without repeats.
func checkTags(tags []string) ([]string, error) {
	for _, t := range tags {
		if t == "" {
			return nil, fmt.Errorf("%w: empty tag", ErrInvalidTag)
		}
		if len(t) > MaxTagBytes {
			return nil, fmt.Errorf("%w: a tag of %d bytes, limit %d", ErrInvalidTag, len(t), MaxTagBytes)
		}
	}
	out := slices.Clone(tags)
	slices.Sort(out)
	out = slices.Compact(out)
	if len(out) > MaxTags {
		return nil, fmt.Errorf("%w: %d tags, limit %d", ErrInvalidTag, len(out), MaxTags)
	}
	return out, nil
}

// tagging is the tags a value is to be stored with: none, a valid set,
// or the error of an invalid one (then the value is not stored).
type tagging struct {
	tags   []string
	err    error
	minted bool // SetMintedTags: admitted while the index is below half its bound
}

func (t tagging) any() bool { return len(t.tags) > 0 || t.err != nil }

// generation is what a rebuild knows of the purge generation from before
// its load began.
type generation struct {
	val   uint64
	known bool      // val was read; false: tags were off in this Cache, or the read failed or was late
	sent  time.Time // when the read (or, without one, the ACQUIRE) was sent: before the load began
}

// genRead is the read of the purge generation that goes with an ACQUIRE.
// On a client of one master it is sent in the ACQUIRE's pipeline. On a
// Cluster or a Ring the generation's key lives on its own master, so it
// is sent beside the ACQUIRE and waited for only genWait more (a master
// that does not answer must not hold up every miss of the others).
type genRead struct {
	cmd  *redis.StringCmd // nil: no read
	sent time.Time
	done chan struct{} // closed when an asynchronous read has its answer
}

// genWait bounds how long a rebuild on a Cluster or a Ring waits, after
// its ACQUIRE's answer, for the purge generation's; genPause is how long
// a Cache stops reading it there after a late or failed answer.
const (
	genWait  = 50 * time.Millisecond
	genPause = 5 * time.Second
)

// newGenRead starts the read of the purge generation for the ACQUIRE
// about to be sent. While this Cache has seen no tag there is no read: a
// Cache that never uses tags never pays for it, and a rebuild without it
// is still stored unless a tag of its value was purged in the last two
// minutes (see recordTags). It must be called from work that Close waits
// for (a flight or a refresh): an asynchronous read is counted in c.wg.
func (c *Cache) newGenRead() genRead {
	g := genRead{sent: time.Now()}
	if !c.tagsOn.Load() || time.Now().UnixNano() < c.genPausedUntil.Load() {
		return g
	}
	g.cmd = redis.NewStringCmd(c.ctx, "GET", c.genKey)
	if !c.oneMaster {
		cmd, done := g.cmd, make(chan struct{})
		g.done = done
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			defer close(done)
			_ = c.rdb.Process(c.ctx, cmd)
		}()
	}
	return g
}

// side is the command to send in the ACQUIRE's pipeline (nil for none).
func (g genRead) side() redis.Cmder {
	if g.cmd == nil || g.done != nil {
		return nil
	}
	return g.cmd
}

// result is the generation read, once the ACQUIRE returned, before any
// load begins.
func (c *Cache) genResult(g genRead) generation {
	gen := generation{sent: g.sent}
	if g.cmd == nil {
		return gen
	}
	if g.done != nil {
		t := time.NewTimer(c.genWait)
		defer t.Stop()
		select {
		case <-g.done:
		case <-t.C:
			c.genPausedUntil.Store(time.Now().Add(genPause).UnixNano())
			return gen // it may be answered after the load began: unusable
		}
	}
	v, err := parseGen(g.cmd)
	if err != nil {
		if g.done != nil && isInfraError(err) {
			c.genPausedUntil.Store(time.Now().Add(genPause).UnixNano())
		}
		return gen
	}
	gen.val, gen.known = v, true
	return gen
}

// parseGen reads a generation; a missing one is 0 (no purge ever, or it
// was lost: every tag's memory of a purge then refuses, which is safe).
func parseGen(cmd *redis.StringCmd) (uint64, error) {
	s, err := cmd.Result()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(s, 10, 64)
}

// useTags turns on the read of the purge generation on every rebuild of
// this Cache from now on.
func (c *Cache) useTags() { c.tagsOn.Store(true) }

// SetTags lets a [LoadFunc] tag the value it returns: [Cache.InvalidateTag]
// of any of the tags invalidates it, in every process, and no rebuild of
// it that began before that purge stores its value afterwards. It must be
// called with the context the loader was given, before the loader
// returns; each call replaces the tags of the previous one. Tags are any
// non-empty strings of up to [MaxTagBytes] bytes, at most [MaxTags] of
// them; repeats count once. They also tag a negative entry (the loader
// returned [ErrNotFound]).
//
// SetTags returns an error wrapping [ErrInvalidTag] for an invalid tag,
// or for a context that is not a loader's; after one (unless a later call
// sets valid tags) the value is returned to its callers but not stored. A
// value whose tags cannot be recorded (Redis fails, a tag's index is
// full: [Options.MaxTagEntries]) is not stored either, nor one whose
// rebuild a purge of one of its tags may have come after (counted in
// [Stats].Fenced). A Cache that has seen no tag yet does not read the
// purge generation on its rebuilds, which the check needs to tell a purge
// that came before the rebuild from one after it: its first tagged
// rebuild is not stored if a tag of the value was purged in the last two
// minutes.
func SetTags(ctx context.Context, tags ...string) error {
	e, ok := ctx.Value(expiryKey{}).(*expiry)
	if !ok {
		return fmt.Errorf("%w: SetTags outside a loader's context", ErrInvalidTag)
	}
	t, err := checkTags(tags)
	if e.c != nil {
		e.c.useTags()
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.tags = tagging{tags: t, err: err}
	return err
}

// SetMintedTags is [SetTags] for the value of a key that any client can
// mint (an HTTP URL with a query string, a 404 page): the key is
// recorded in a tag's index only while the index holds fewer than half
// of [Options.MaxTagEntries] keys (a key already in it stays), and the
// value is otherwise not stored, as when the index is full
// ([ErrTagFull]). Keys minted without bound then never fill an index
// for the keys tagged with SetTags: those keep half of it at least.
func SetMintedTags(ctx context.Context, tags ...string) error {
	err := SetTags(ctx, tags...)
	if e, ok := ctx.Value(expiryKey{}).(*expiry); ok {
		e.mu.Lock()
		e.tags.minted = true
		e.mu.Unlock()
	}
	return err
}

// SetTags tags the value this Fill commits, as [SetTags] does for a
// loader's. Call it before Commit; each call replaces the tags of the
// previous one. It returns an error wrapping [ErrInvalidTag] for an
// invalid tag; Commit then hands the value to the waiting callers but
// does not store it. It is safe to call from any goroutine.
func (fl *Fill) SetTags(tags ...string) error {
	t, err := checkTags(tags)
	fl.c.useTags()
	fl.tagMu.Lock()
	defer fl.tagMu.Unlock()
	fl.tags = tagging{tags: t, err: err}
	return err
}

// SetMintedTags is [Fill.SetTags] for a key that any client can mint; see
// the package-level [SetMintedTags].
func (fl *Fill) SetMintedTags(tags ...string) error {
	err := fl.SetTags(tags...)
	fl.tagMu.Lock()
	defer fl.tagMu.Unlock()
	fl.tags.minted = true
	return err
}

func (fl *Fill) tagging() tagging {
	fl.tagMu.Lock()
	defer fl.tagMu.Unlock()
	return fl.tags
}

// tagBound is the most keys a tag's index may hold when t's key is added:
// MaxTagEntries, half of it for a minted key (SetMintedTags).
func (c *Cache) tagBound(t tagging) int {
	if t.minted {
		return max(c.cfg.MaxTagEntries/2, 1)
	}
	return c.cfg.MaxTagEntries
}

// indexTags records f's key in the index of each of its tags before its
// COMMIT. ok is false when the value must not be stored: a purge of a tag
// may have come after the rebuild began, or the tags could not be
// recorded. Then the lease has been released (the waiters look again)
// and cur is the value's currency for its local callers.
func (c *Cache) indexTags(f *flight, lease *Lease, t tagging, ttl time.Duration, loadStart time.Time) (cur currency, ok bool) {
	purged, err := false, t.err
	if err == nil {
		purged, err = c.recordTags(c.ctx, f.keys.Hash(), t.tags, ttl, &f.gen, c.tagBound(t))
	}
	if c.tagHooks != nil && c.tagHooks.indexed != nil {
		c.tagHooks.indexed(f.key, purged, err)
	}
	if err == nil && !purged {
		return currency{}, true
	}
	c.releaseDetached(f, lease, msgReleased, 0)
	if err != nil {
		c.stats.commitErrors.Add(1)
		c.sig.commit(f.key, CommitError)
		c.redisFailed(err)
		c.log(slog.LevelWarn, "herd: the value's tags could not be recorded; the value was returned but not stored", "key", f.key, "err", err)
	} else {
		c.stats.fenced.Add(1)
		c.sig.commit(f.key, CommitFenced)
		c.log(slog.LevelWarn, "herd: commit refused: a tag of the value was purged after its rebuild began; value not stored", "key", f.key, "fence", lease.token)
	}
	return currency{from: loadStart}, false
}

// recordTags runs TAGADD for each tag of the key whose hash tag is
// member, for a value whose hard ttl is ttl. gen is what the rebuild
// knows of the purge generation; nil (for Set) skips the purge check.
// purged reports that a purge of a tag may have come after the rebuild
// began: its TAGADD found the tag purged after gen, or, without gen,
// purged in the last purgedTTL.
//
// most is the most keys a tag's index may hold with this one (see
// tagBound).
func (c *Cache) recordTags(ctx context.Context, member string, tags []string, ttl time.Duration, gen *generation, most int) (purged bool, err error) {
	g0, base := "", time.Time{}
	if gen != nil {
		g0, base = "?", gen.sent
		if gen.known {
			g0 = strconv.FormatUint(gen.val, 10)
		}
		if time.Since(base) > tagWindow/2 {
			// A long rebuild: a tag may have forgotten a purge that came
			// after it began. Any purge since it began refuses it.
			if !gen.known {
				return true, nil
			}
			sent := time.Now()
			now, err := parseGen(c.rdb.Get(ctx, c.genKey))
			if err != nil {
				return false, fmt.Errorf("herd: read the purge generation: %w", err)
			}
			if now != gen.val {
				return true, nil
			}
			base = sent
		}
	}
	calls := make([]*scriptCall, len(tags))
	for i, tag := range tags {
		tk := makeTagKeys(c.cfg.Prefix, tag)
		calls[i] = &scriptCall{route: tk.Index, keys: []string{tk.Index, tk.Purged},
			args: []any{g0, member, ttl.Milliseconds(), tagGrace.Milliseconds(), most}}
	}
	c.repl.runBatch(ctx, c.rdb, tagAddScript, calls)
	var errs []error
	for i, call := range calls {
		n, err := call.cmd.Int()
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("herd: record tag %q: %w", tags[i], err))
		case n == 2:
			errs = append(errs, fmt.Errorf("%w: tag %q holds %d keys", ErrTagFull, tags[i], most))
		case call.werr != nil:
			errs = append(errs, fmt.Errorf("herd: record tag %q: %w", tags[i], call.werr))
		case n == 0:
			purged = true
		}
	}
	if gen != nil && time.Since(base) >= tagWindow {
		purged = true // too slow to rule out a purge whose memory ran out
	}
	return purged, errors.Join(errs...)
}

// InvalidateTag invalidates every value stored with any of tags, by
// [Cache.Get], [Fetch], [Cache.Begin], [Cache.Set] or the HTTP
// middleware, in every process that shares the Redis and the prefix: it
// deletes each one and advances its key's fence, as [Cache.Invalidate]
// does. When it returns nil, no rebuild that began before it was called
// stores a value with one of the tags afterwards: a rebuild in flight,
// whether or not its key was already in the tag's index, is either
// refused (its value goes to its callers, unstored, counted in
// [Stats].Fenced) or fenced.
//
// It costs one script to raise the purge generation, one per tag and page
// of [purgePage] keys to read the tag's index, and one INVALIDATE per
// key, pipelined per master. It returns an error when any step failed:
// the Redis error, or [ErrNotReplicated] when too few replicas
// acknowledged a step. Some keys may then have been invalidated and
// others not; the tags' indexes are kept, so calling it again is safe
// and finishes the job. With no tags it does nothing. Errors:
// [ErrInvalidTag], [ErrClosed] after Close. When ctx ends first,
// InvalidateTag returns at once with an error wrapping ctx.Err(); the
// purge goes on until it is done or the Cache is closed.
func (c *Cache) InvalidateTag(ctx context.Context, tags ...string) error {
	if c.isClosed() {
		return ErrClosed
	}
	t, err := checkTags(tags)
	if err != nil {
		return fmt.Errorf("herd: invalidate tags: %w", err)
	}
	if len(t) == 0 {
		return nil
	}
	c.useTags()
	_, err = leaveOnDone(ctx, c.track, func() (struct{}, error) {
		// The purge belongs to no caller: it runs to its end unless Close.
		wctx, stop := endWith(context.WithoutCancel(ctx), c.ctx)
		defer stop()
		err := c.purge(wctx, t)
		c.wroteAll() // even on an error: some keys may be invalidated
		return struct{}{}, err
	}, nil)
	if err != nil && ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		c.wroteAll() // the caller left: keys may still be invalidated after it
	}
	if err != nil {
		return fmt.Errorf("herd: invalidate tags %q: %w", t, err)
	}
	return nil
}

// purge is InvalidateTag's work.
func (c *Cache) purge(ctx context.Context, tags []string) error {
	repl := c.repl
	cmd, werr := repl.run(ctx, c.rdb, c.genKey, tagBumpScript, []string{c.genKey})
	g, err := cmd.Text()
	if err == nil {
		err = werr // a failover could lose it: G could come back to a rebuild's G0
	}
	if err != nil {
		return fmt.Errorf("raise the purge generation: %w", err)
	}
	if c.tagHooks != nil && c.tagHooks.bumped != nil {
		c.tagHooks.bumped()
	}
	members, err := c.scanTags(ctx, tags, g)
	if err != nil {
		return err
	}
	if c.tagHooks != nil && c.tagHooks.scanned != nil {
		c.tagHooks.scanned(len(members))
	}
	calls := make([]*scriptCall, 0, len(members))
	for m := range members {
		keys := wire.FamilyOf(c.cfg.Prefix, m)
		calls = append(calls, &scriptCall{route: keys.Fence, keys: []string{keys.Value, keys.Fence, keys.Writes + newOwner()},
			args: []any{c.fenceTTL(time.Hour).Milliseconds(), writeMarkerTTL.Milliseconds(), c.nearChan, m}})
	}
	repl.runBatch(ctx, c.rdb, invalidateScript, calls)
	var errs []error
	failed := 0
	for _, call := range calls {
		err := call.cmd.Err()
		if err == nil {
			err = call.werr
		}
		if err != nil {
			failed++
			if len(errs) < 3 {
				errs = append(errs, err)
			}
		}
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d keys not invalidated: %w", failed, len(calls), errors.Join(errs...))
	}
	return nil
}

// scanTags raises each tag's purge generation to g and returns the hash
// tags of the live keys in their indexes. The tags are read at once (one
// pipelined round trip per page).
func (c *Cache) scanTags(ctx context.Context, tags []string, g string) (map[string]struct{}, error) {
	type scan struct {
		tag    string
		keys   tagFamily
		cursor string
	}
	active := make([]*scan, len(tags))
	for i, tag := range tags {
		active[i] = &scan{tag: tag, keys: makeTagKeys(c.cfg.Prefix, tag), cursor: "0"}
	}
	members := make(map[string]struct{})
	for page := 0; len(active) > 0; page++ {
		if page >= maxPurgePages {
			return nil, fmt.Errorf("%w: reading the tag index took more than %d pages", errPurgeTooLong, maxPurgePages)
		}
		calls := make([]*scriptCall, len(active))
		for i, s := range active {
			calls[i] = &scriptCall{route: s.keys.Index, keys: []string{s.keys.Index, s.keys.Purged},
				args: []any{g, purgedTTL.Milliseconds(), s.cursor, purgePage}}
		}
		c.repl.runBatch(ctx, c.rdb, tagPurgeScript, calls)
		next := active[:0]
		for i, s := range active {
			res, err := calls[i].cmd.StringSlice()
			if err == nil && len(res) == 0 {
				err = fmt.Errorf("%w: empty reply", errBadReply)
			}
			if err == nil {
				err = calls[i].werr
			}
			if err != nil {
				return nil, fmt.Errorf("purge tag %q: %w", s.tag, err)
			}
			for _, m := range res[1:] {
				if wire.IsHashTag(m) {
					members[m] = struct{}{}
				}
			}
			if s.cursor = res[0]; s.cursor != "0" {
				next = append(next, s)
			}
		}
		active = next
		if c.tagHooks != nil && c.tagHooks.paged != nil && len(active) > 0 {
			c.tagHooks.paged(page)
		}
	}
	return members, nil
}

// wroteAll counts a write of every key in this Cache (see currency): a
// purge may have written any.
func (c *Cache) wroteAll() {
	for i := range c.writes {
		c.writes[i].Add(1)
	}
	c.nearWroteAll()
}

// tagHooks lets tests order a tagged commit and a purge.
type tagHooks struct {
	indexed func(key string, purged bool, err error) // after a rebuild's TAGADDs, before its COMMIT
	bumped  func()                                   // after a purge raised G, before it reads the indexes
	scanned func(keys int)                           // after a purge read the indexes, before it invalidates
	paged   func(page int)                           // after a page of a purge's scan, when another follows
}
