package herd

import (
	_ "embed"

	"github.com/redis/go-redis/v9"
)

// script is one of herd's Lua scripts, declared with what it does to
// Redis. A script has no method that sends it: only the write path
// (writepath.go) does, so every write herd makes gets the same replica
// wait, the same classification of its error and the same ctx hand-off.
// TestEveryScriptGoesThroughTheWritePath checks that no other code sends
// one, and that each script's kind matches its Lua.
type script struct {
	name string
	kind scriptKind
	rs   *redis.Script
}

// scriptKind says how the write path sends a script.
type scriptKind uint8

const (
	// reads: the script writes nothing (a GET that must reach the master,
	// an inspection).
	reads scriptKind = iota
	// writes: the script writes, and advances or relies on a fence; the
	// replica wait of its owner's options follows it in the same pipeline,
	// so a write reported done is on the replicas a failover promotes.
	writes
	// releases: the script only gives a lease back (and wakes its
	// waiters). It is not waited for: a release a failover loses costs
	// the rest of the lease, never a second holder.
	releases
)

func newScript(name string, kind scriptKind, lua string) *script {
	return &script{name: name, kind: kind, rs: redis.NewScript(lua)}
}

var (
	//go:embed scripts/acquire.lua
	acquireLua string
	//go:embed scripts/extend.lua
	extendLua string
	//go:embed scripts/release.lua
	releaseLua string
	//go:embed scripts/commit.lua
	commitLua string
	//go:embed scripts/set.lua
	setLua string
	//go:embed scripts/invalidate.lua
	invalidateLua string
	//go:embed scripts/soft.lua
	softLua string
	//go:embed scripts/fencedset.lua
	fencedSetLua string
	//go:embed scripts/tagadd.lua
	tagAddLua string
	//go:embed scripts/tagpurge.lua
	tagPurgeLua string
	//go:embed scripts/tagbump.lua
	tagBumpLua string
	//go:embed scripts/redlock_acquire.lua
	redlockAcquireLua string
	//go:embed scripts/redlock_raise.lua
	redlockRaiseLua string
	//go:embed scripts/redlock_extend.lua
	redlockExtendLua string
	//go:embed scripts/redlock_release.lua
	redlockReleaseLua string
	//go:embed scripts/inspect.lua
	inspectLua string

	// getLua is GET as a script, which a cluster client sends to the
	// slot's master even when it routes reads to replicas.
	getLua = `return redis.call('GET', KEYS[1])`
)

var (
	acquireScript    = newScript("acquire", writes, acquireLua)
	extendScript     = newScript("extend", writes, extendLua)
	releaseScript    = newScript("release", releases, releaseLua)
	commitScript     = newScript("commit", writes, commitLua)
	setScript        = newScript("set", writes, setLua)
	invalidateScript = newScript("invalidate", writes, invalidateLua)
	softScript       = newScript("soft", writes, softLua)
	fencedSetScript  = newScript("fencedset", writes, fencedSetLua)
	tagAddScript     = newScript("tagadd", writes, tagAddLua)
	tagPurgeScript   = newScript("tagpurge", writes, tagPurgeLua)
	tagBumpScript    = newScript("tagbump", writes, tagBumpLua)

	redlockAcquireScript = newScript("redlock_acquire", writes, redlockAcquireLua)
	redlockRaiseScript   = newScript("redlock_raise", writes, redlockRaiseLua)
	redlockExtendScript  = newScript("redlock_extend", writes, redlockExtendLua)
	redlockReleaseScript = newScript("redlock_release", releases, redlockReleaseLua)

	inspectScript = newScript("inspect", reads, inspectLua)
	getScript     = newScript("get", reads, getLua)
)

// allScripts lists every script, for the write path's guard test.
var allScripts = []*script{
	acquireScript, extendScript, releaseScript, commitScript, setScript,
	invalidateScript, softScript, fencedSetScript, tagAddScript,
	tagPurgeScript, tagBumpScript, redlockAcquireScript, redlockRaiseScript,
	redlockExtendScript, redlockReleaseScript, inspectScript, getScript,
}
