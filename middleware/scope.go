package middleware

import (
	"fmt"
	"runtime"
	"strings"
	"sync"
	"weak"

	"github.com/herdkit/herd"
)

// Scopes. Without Options.Scope, a key holds no trace of the listener:
// the instances of a service share entries wherever they listen (two
// processes on :8080 and :8081 of one host, behind one nginx, or one port
// per pod). What the port scope used to give, that an internal and a
// public server in one process, each with its own handler on one Cache,
// never serve each other's entries (the client picks the Host), is kept
// by a rule that New checks: the middlewares made on one Cache have
// distinct scopes, the unscoped one counting as one. The rule is the
// same in every process, because it is a property of the code, so two
// middlewares that must not share never do, whichever instance stored an
// entry. One middleware may wrap any number of handlers (routes) and be
// served by any number of servers: they are then one namespace by
// choice.

// scopeSet is the scopes of the middlewares made on one Cache.
type scopeSet struct {
	scopes map[string]bool // guarded by scopesMu
	shared bool            // tests only: New on the Cache skips the rule (see shareScopes in the tests)
}

var (
	scopesMu sync.Mutex
	scopes   = map[weak.Pointer[herd.Cache]]*scopeSet{} // an entry goes when its Cache is collected
)

// scopesOf returns c's scopeSet. scopesMu must be held.
func scopesOf(c *herd.Cache) *scopeSet {
	wp := weak.Make(c)
	if ss := scopes[wp]; ss != nil {
		return ss
	}
	ss := &scopeSet{scopes: map[string]bool{}}
	scopes[wp] = ss
	runtime.AddCleanup(c, func(wp weak.Pointer[herd.Cache]) {
		scopesMu.Lock()
		delete(scopes, wp)
		scopesMu.Unlock()
	}, wp)
	return ss
}

// claimScope records that a middleware with scope is made on c, and
// panics if another one on c has it already.
func claimScope(c *herd.Cache, scope string) {
	scopesMu.Lock()
	defer scopesMu.Unlock()
	ss := scopesOf(c)
	switch {
	case ss.shared:
		return
	case ss.scopes[scope] && scope == "":
		panic("herd/middleware: New: a second middleware on this Cache without an Options.Scope. " +
			"Middlewares on one Cache need distinct Scopes, so that two servers (an internal and a public one) never serve each other's entries: " +
			"wrap several routes of one server with one middleware (one middleware in front of two servers shares their entries), or give each middleware a Scope of its own")
	case ss.scopes[scope]:
		panic(fmt.Sprintf("herd/middleware: New: Options.Scope %q is already the scope of another middleware on this Cache; middlewares on one Cache need distinct Scopes", scope))
	}
	ss.scopes[scope] = true
}

// hostKey is the Host a key holds: r.Host without its port, as nginx's
// $host has it, so that the instances of a service on different ports
// (and the curl of a local test to each) share entries, and in lower
// case, as $host is too (a host name is not case-sensitive, RFC 3986
// §3.2.2). A port that is not all digits is not a port: the Host is kept
// whole, and so is an IPv6 address without brackets.
func hostKey(host string) string {
	return strings.ToLower(portless(host))
}

// portless is host without a port of digits.
func portless(host string) string {
	i := len(host) - 1
	for i >= 0 && '0' <= host[i] && host[i] <= '9' {
		i--
	}
	if i < 0 || host[i] != ':' {
		return host
	}
	name := host[:i]
	if len(name) > 0 && name[0] == '[' {
		if name[len(name)-1] != ']' {
			return host // an IPv6 literal whose bracket is not closed
		}
		return name
	}
	for j := 0; j < len(name); j++ {
		if name[j] == ':' {
			return host // an IPv6 address without brackets: no port to strip
		}
	}
	return name
}
