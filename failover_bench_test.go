package herd

import (
	"context"
	"strconv"
	"testing"
	"time"
)

// BenchmarkReplicaWait measures what the replica wait costs, on a real
// master with two replicas on this machine, in the same run: the miss
// path (GET, ACQUIRE and COMMIT, each script followed by a pipelined
// WAIT), Set and Invalidate, each with the default options (wait) and
// with ReplicaAcks -1 (nowait). One goroutine: latency per operation.
func BenchmarkReplicaWait(b *testing.B) {
	p := startReplicated(b)
	ctx := context.Background()
	payload := make([]byte, 512)
	load := func(context.Context) ([]byte, error) { return payload, nil }
	for _, op := range []string{"Miss", "Set", "Invalidate"} {
		for _, mode := range []struct {
			name string
			acks int
		}{{"wait", 0}, {"nowait", -1}} {
			b.Run(op+"/"+mode.name, func(b *testing.B) {
				c := New(p.m, &Options{ReplicaAcks: mode.acks})
				defer c.Close()
				i := 0
				for b.Loop() {
					i++
					key := op + mode.name + strconv.Itoa(i)
					var err error
					switch op {
					case "Miss":
						_, err = c.Get(ctx, key, time.Minute, load)
					case "Set":
						err = c.Set(ctx, "set", payload, time.Minute)
					case "Invalidate":
						err = c.Invalidate(ctx, "inv")
					}
					if err != nil {
						b.Fatal(err)
					}
				}
				if op == "Miss" && c.Stats().Loads != uint64(i) {
					b.Fatalf("%d loads for %d misses", c.Stats().Loads, i)
				}
			})
		}
	}
}
