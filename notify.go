package herd

import (
	"github.com/herdkit/herd/internal/pubsub"
	"github.com/redis/go-redis/v9"
)

// Messages published on a key's channel. The first byte is the kind.
const (
	msgReleased = "R" // the lease was released without a value: look again
	msgValue    = 'V' // followed by the new envelope
	msgWritten  = "W" // a value was written, too large to send: GET it
	msgFailed   = 'F' // followed by a failure kind and the error text
)

// Failure kinds after msgFailed.
const (
	failError     = 'e' // the loader returned an error
	failPanic     = 'p' // the loader panicked
	failNotFound  = 'n' // the loader returned ErrNotFound and negatives are not cached
	failNotShared = 'u' // the value is not for sharing (Fill.Abort with ErrNotShared)
	failNoShare   = 'l' // the loader's error is not for sharing (NoShare): retry
	failTooLarge  = 't' // the loader's value was above MaxValueBytes (an earlier version reads it as 'e')
)

// The wake-up channels of a Locker or a Cache are multiplexed over a few
// pub/sub connections by internal/pubsub, which knows nothing of the
// messages above: how a waiter reads them is in flight.go (heard) and
// locker.go.
type (
	notifier     = pubsub.Notifier
	subscription = pubsub.Subscription
	notice       = pubsub.Notice
)

// newNotifier returns the notifier of rdb; after its close, subscribing
// returns ErrClosed.
func newNotifier(rdb redis.UniversalClient) *notifier {
	return pubsub.New(rdb, ErrClosed)
}
