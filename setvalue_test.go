package herd

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/herdkit/herd/internal/redistest"
)

// failCodec is a Codec whose Marshal fails.
type failCodec struct{ JSON }

var errCodec = errors.New("codec says no")

func (failCodec) Marshal(any) ([]byte, error) { return nil, errCodec }

// TestSetValueRoundTrip: a value written with SetValue (with tags
// or without) is what Fetch[T] returns, without calling the loader; a tagged one goes
// with its tag.
func TestSetValueRoundTrip(t *testing.T) {
	t.Parallel()
	type user struct {
		ID   int
		Name string
	}
	c := New(redistest.Start(t).Client(t), nil)
	defer c.Close()
	ctx := context.Background()
	noLoad := func(context.Context) (user, error) {
		t.Error("the loader ran: the written value was not read back")
		return user{}, nil
	}
	want := user{42, "Ada"}
	if err := SetValue(ctx, c, "user:42", want, time.Minute); err != nil {
		t.Fatal(err)
	}
	if got, err := Fetch(ctx, c, "user:42", time.Minute, noLoad); err != nil || got != want {
		t.Errorf("Fetch after SetValue: %+v, %v; want %+v", got, err, want)
	}

	tagged := user{7, "Grace"}
	if err := SetValue(ctx, c, "user:7", tagged, time.Minute, "team:1"); err != nil {
		t.Fatal(err)
	}
	if got, err := Fetch(ctx, c, "user:7", time.Minute, noLoad); err != nil || got != tagged {
		t.Errorf("Fetch after a tagged SetValue: %+v, %v; want %+v", got, err, tagged)
	}
	if err := c.InvalidateTag(ctx, "team:1"); err != nil {
		t.Fatal(err)
	}
	if v, ok, err := c.Peek(ctx, "user:7"); ok || err != nil {
		t.Errorf("after InvalidateTag: %q, %v, %v; want nothing", v, ok, err)
	}
}

// TestSetValueCodecError: a value the codec cannot encode is a wrapped
// codec error and nothing is written; the same for JSON's own failure.
func TestSetValueCodecError(t *testing.T) {
	t.Parallel()
	rdb := redistest.Start(t).Client(t)
	ctx := context.Background()
	c := New(rdb, &Options{Codec: failCodec{}})
	defer c.Close()
	if err := SetValue(ctx, c, "k", 1, time.Minute); !errors.Is(err, errCodec) {
		t.Errorf("SetValue with a failing codec: %v, want it to wrap the codec's error", err)
	}
	if err := SetValue(ctx, c, "k", 1, time.Minute, "t"); !errors.Is(err, errCodec) {
		t.Errorf("tagged SetValue with a failing codec: %v, want it to wrap the codec's error", err)
	}
	if _, ok, err := c.Peek(ctx, "k"); ok || err != nil {
		t.Errorf("after the failed writes: ok %v, err %v; want nothing stored", ok, err)
	}

	j := New(rdb, nil)
	defer j.Close()
	var jerr *json.UnsupportedTypeError
	if err := SetValue(ctx, j, "ch", make(chan int), time.Minute); !errors.As(err, &jerr) {
		t.Errorf("SetValue of a chan with JSON: %v, want a *json.UnsupportedTypeError", err)
	}
}
