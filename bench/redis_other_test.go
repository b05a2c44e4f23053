//go:build !unix

package main

import "testing"

// checkDefaultRedis checks that a run without -redis, -cluster or
// -embedded used the embedded miniredis: the bench starts no redis-server
// outside Unix.
func checkDefaultRedis(t *testing.T, res *results) {
	t.Helper()
	if res.RedisSrc != redisEmbedded || res.Redis != miniredisDesc {
		t.Errorf("Redis %q (%s), want the embedded miniredis", res.Redis, res.RedisSrc)
	}
}
