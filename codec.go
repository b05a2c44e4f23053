package herd

import "encoding/json"

// Codec turns the values of [Fetch] and [SetValue] into bytes and back. Implementations
// must be safe for concurrent use.
type Codec interface {
	Marshal(v any) ([]byte, error)
	Unmarshal(data []byte, v any) error
}

// JSON is the default [Codec], encoding/json.
type JSON struct{}

// Marshal implements [Codec].
func (JSON) Marshal(v any) ([]byte, error) { return json.Marshal(v) }

// Unmarshal implements [Codec].
func (JSON) Unmarshal(data []byte, v any) error { return json.Unmarshal(data, v) }
