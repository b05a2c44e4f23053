package herd

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// maxFailText bounds the error text a leader publishes to followers.
const maxFailText = 1024

// loadFailure is what a load of key that failed with cause (not
// ErrNotFound) tells: the error its callers in this process get, and the
// kind and text of the failure message for the others. A panic sends its
// value's text, an error its text, a NoShare error nothing of it.
func loadFailure(key string, cause error) (err *LoadError, kind byte, text string) {
	err = newLoadError(key, cause)
	var pe *PanicError
	switch {
	case isNoShare(cause):
		return err, failNoShare, notSharedText
	case errors.As(cause, &pe):
		return err, failPanic, fmt.Sprint(pe.Value)
	case errors.Is(cause, ErrValueTooLarge):
		return err, failTooLarge, err.Msg
	}
	return err, failError, err.Msg
}

// remoteLoadError is the error a follower of key gets from a failure
// message of the given kind and text.
func remoteLoadError(key string, kind byte, text string) *LoadError {
	// A process of an earlier version sent the whole error, key and
	// prefix included (and a panic's stack): keep only the cause.
	text = strings.TrimPrefix(text, ErrLoadFailed.Error()+": "+strconv.Quote(key)+": ")
	e := &LoadError{Key: key, Msg: text, Remote: true}
	switch kind {
	case failPanic:
		if rest, ok := strings.CutPrefix(text, "herd: loader panicked: "); ok {
			text, _, _ = strings.Cut(rest, "\n\n")
		}
		pe := &PanicError{Value: text, Remote: true}
		e.Msg, e.Err = "herd: loader panicked: "+text, pe
	case failNoShare:
		e.Msg = notSharedText
	case failTooLarge:
		e.Err = ErrValueTooLarge
	}
	return e
}

// failMessage is the wake-up message of a failed load: the kind, the
// failed lease's fence (so followers of another leader ignore it) and the
// error text.
func failMessage(kind byte, lease *Lease, text string) string {
	return string([]byte{msgFailed, kind}) + strconv.FormatUint(lease.token, 10) + "|" + cutText(text, maxFailText)
}

// cutText cuts text to at most n bytes, not inside a UTF-8 sequence: a
// follower's LoadError (n is maxFailText) carries valid text, which a
// JSON log line or a gRPC status needs, whenever the leader's was.
func cutText(text string, n int) string {
	if len(text) <= n {
		return text
	}
	cut := n
	for cut > n-utf8.UTFMax && !utf8.RuneStart(text[cut]) {
		cut--
	}
	return text[:cut]
}

// parseFailMessage splits a failure message into its parts.
func parseFailMessage(msg string) (kind byte, fence, text string) {
	kind = failError
	if len(msg) >= 2 {
		kind = msg[1]
	}
	if len(msg) > 2 {
		rest := msg[2:]
		if i := strings.IndexByte(rest, '|'); i >= 0 {
			return kind, rest[:i], rest[i+1:]
		}
		return kind, "", rest
	}
	return kind, "", ""
}
