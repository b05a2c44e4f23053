package herd

import (
	"testing"
	"time"
)

func TestBreakerTransitions(t *testing.T) {
	b := &breaker{threshold: 2, cooldown: time.Hour}
	passCooldown := func() { b.mu.Lock(); b.openUntil = time.Now().Add(-time.Millisecond); b.mu.Unlock() }
	if !b.allow() || b.success() {
		t.Fatal("a fresh breaker must allow, and a success must not report a close")
	}
	if b.failure() {
		t.Fatal("the first failure opened the breaker (threshold 2)")
	}
	if !b.allow() {
		t.Fatal("one failure below the threshold must still allow")
	}
	if !b.failure() {
		t.Fatal("the second consecutive failure did not open the breaker")
	}
	if b.allow() {
		t.Fatal("an open breaker allowed a call before its cooldown")
	}
	passCooldown()
	if !b.allow() {
		t.Fatal("no probe after the cooldown")
	}
	if b.allow() {
		t.Fatal("a second probe while one runs")
	}
	if b.failure() {
		t.Fatal("a failed probe reported opening again as a new open")
	}
	if b.allow() {
		t.Fatal("a failed probe did not reopen the breaker")
	}
	passCooldown()
	if !b.allow() || !b.success() {
		t.Fatal("a successful probe did not close the breaker")
	}
	if !b.allow() || b.troubled.Load() {
		t.Fatal("a closed breaker is still marked troubled")
	}
	// A success between failures resets the count: not consecutive.
	b.failure()
	b.success()
	if b.failure() {
		t.Fatal("failures separated by a success opened the breaker")
	}
}
