package middleware

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
)

// Gzip storage. Unless the key holds an encoding bucket (Accept-Encoding
// in KeyHeaders, see encoding.go), every entry is stored one of two ways:
//
//   - identity: the body as the handler wrote it, served as is to every
//     client;
//   - gzip-coded (Content-Encoding: gzip): the body herd compressed
//     (Options.Compress), or the one the handler compressed itself. Its ETag is the identity
//     representation's (the handler's, else a hash of the decoded body);
//     a client that accepts gzip gets the stored bytes under that ETag
//     with "-gzip" appended inside its quotes (each representation has a
//     strong validator of its own, RFC 9110 §8.8.3), any other client the
//     decoded body, and both get Vary: Accept-Encoding.
//
// The decoded body is never larger than MaxBodyBytes: a stored gzip
// stream that decodes to more (a gzip bomb from a foreign writer) is a
// corrupt entry.

// defaultCompressMinBytes is Options.CompressMinBytes' default.
const defaultCompressMinBytes = 1024

// compressibleTypes are the media types, beside text/* and the +json and
// +xml suffixes, that Compress compresses. Other types (images, video,
// archives, fonts in WOFF) are compressed already, or unknown.
var compressibleTypes = []string{
	"application/ecmascript",
	"application/javascript",
	"application/json",
	"application/ld+json",
	"application/manifest+json",
	"application/rtf",
	"application/toml",
	"application/vnd.ms-fontobject",
	"application/wasm",
	"application/x-javascript",
	"application/x-ndjson",
	"application/x-yaml",
	"application/xml",
	"application/yaml",
	"font/otf",
	"font/ttf",
	"image/bmp",
	"image/svg+xml",
	"image/vnd.microsoft.icon",
	"image/x-icon",
}

// compressible reports whether a response of this Content-Type is worth
// compressing. A response without one is not.
func compressible(contentType string) bool {
	mt, _, _ := strings.Cut(contentType, ";")
	mt = strings.ToLower(strings.TrimSpace(mt))
	if strings.HasPrefix(mt, "text/") || strings.HasSuffix(mt, "+json") || strings.HasSuffix(mt, "+xml") {
		return true
	}
	return slices.Contains(compressibleTypes, mt)
}

// digestFields describe the bytes of one coding of the content; a
// representation herd recodes drops them.
var digestFields = []string{"Content-Digest", "Content-Md5", "Digest", "Repr-Digest"}

// deleteAnyCase deletes the field name from h under any case of its key.
func deleteAnyCase(h http.Header, name string) {
	for k := range h {
		if strings.EqualFold(k, name) {
			delete(h, k)
		}
	}
}

// contentCoding is the response's Content-Encoding, lowered, with
// identity left out: "" for none.
func contentCoding(h http.Header) string {
	var codings []string
	for _, v := range headerValues(h, "Content-Encoding") {
		for c := range strings.SplitSeq(v, ",") {
			if c = strings.ToLower(strings.TrimSpace(c)); c != "" && c != "identity" {
				codings = append(codings, c)
			}
		}
	}
	return strings.Join(codings, ", ")
}

// addVaryAcceptEncoding lists Accept-Encoding in h's Vary, unless it is
// there (or Vary is *).
func addVaryAcceptEncoding(h http.Header) {
	for _, v := range headerValues(h, "Vary") {
		for name := range strings.SplitSeq(v, ",") {
			if name = strings.TrimSpace(name); name == "*" || strings.EqualFold(name, "Accept-Encoding") {
				return
			}
		}
	}
	h.Add("Vary", "Accept-Encoding")
}

// setETag gives e one canonical Etag field: the one it has (under any
// case), else a hash of body.
func setETag(e *entry, body []byte) {
	tag := headerGet(e.header, "Etag")
	if tag == "" {
		tag = etagOf(body)
	}
	deleteAnyCase(e.header, "Etag")
	e.header["Etag"] = []string{tag}
}

// gzipETag is the ETag of the gzip representation of an entry whose
// identity representation has tag: "-gzip" inside its closing quote,
// weak when tag is.
func gzipETag(tag string) string {
	if len(tag) >= 2 && strings.HasSuffix(tag, `"`) {
		return tag[:len(tag)-1] + `-gzip"`
	}
	return tag + "-gzip"
}

// packed is an entry ready to store: stored, and its decoded body when
// stored is gzip-coded (nil otherwise).
type packed struct {
	stored *entry
	plain  []byte
}

// pack turns e, a response that decide says may be stored, into the
// entry to store, or says why it may not be after all. It always has an
// ETag. Under a bucketed key it is e as the handler coded it. Otherwise
// it is a gzip-coded entry (see the top of this file) when the handler
// coded it with gzip itself (it must decode within MaxBodyBytes), or when
// Compress is set and compressing it pays: a body of CompressMinBytes or
// more, of a compressible type, without Cache-Control: no-transform, that
// gzip shrinks by an eighth at least. A response in any other coding is
// not stored: herd could not decode it for the clients that do not
// accept it.
func (h *handler) pack(e *entry) (packed, string) {
	if h.cfg.encodingKeyed {
		setETag(e, e.body)
		return packed{stored: e}, ""
	}
	noTransform := parseCacheControl(e.header).has("no-transform")
	switch coding := contentCoding(e.header); coding {
	case "":
		setETag(e, e.body)
		if !h.cfg.Compress || noTransform || len(e.body) < h.cfg.CompressMinBytes || !compressible(headerGet(e.header, "Content-Type")) {
			return packed{stored: e}, ""
		}
		gz := gzipBytes(e.body, h.cfg.CompressLevel)
		if len(gz) > len(e.body)-len(e.body)/8 {
			return packed{stored: e}, ""
		}
		s := &entry{status: e.status, header: e.header.Clone(), body: gz}
		s.header.Set("Content-Encoding", "gzip")
		addVaryAcceptEncoding(s.header)
		return packed{stored: s, plain: e.body}, ""
	case "gzip", "x-gzip":
		if noTransform {
			return packed{}, "a gzip response with Cache-Control: no-transform, which Compress may not decode for clients without gzip"
		}
		plain, err := gunzip(e.body, h.cfg.MaxBodyBytes)
		if err != nil {
			return packed{}, "Content-Encoding gzip: " + err.Error()
		}
		// The handler's ETag, if any, is taken as the identity one:
		// compressing middleware commonly keeps the handler's.
		setETag(e, plain)
		for _, f := range digestFields {
			deleteAnyCase(e.header, f) // they describe the handler's gzip bytes
		}
		deleteAnyCase(e.header, "Content-Encoding")
		e.header.Set("Content-Encoding", "gzip")
		addVaryAcceptEncoding(e.header)
		return packed{stored: e, plain: plain}, ""
	default:
		return packed{}, "Content-Encoding " + coding + ", which Compress does not decode"
	}
}

// variant returns the representation of the stored entry e that r's
// client gets: e itself unless it is gzip-coded under a key all clients
// share; then e
// with the gzip ETag for a client that accepts gzip, else e decoded.
// plain is e's decoded body when known (nil: decode it). The body is not
// decoded when r's preconditions answer 304 or 412. An error means e is
// not a response herd can serve: its gzip body does not decode within
// MaxBodyBytes.
func (h *handler) variant(r *http.Request, e *entry, plain []byte) (*entry, error) {
	if h.cfg.encodingKeyed || e.headerFacts().coding != "gzip" {
		return e, nil
	}
	v := &entry{status: e.status, header: maps.Clone(e.header), body: e.body}
	if parseAcceptEncoding(r.Header["Accept-Encoding"])&acceptsGzip != 0 {
		if tag := headerGet(e.header, "Etag"); tag != "" {
			deleteAnyCase(v.header, "Etag")
			v.header["Etag"] = []string{gzipETag(tag)}
		}
		for _, f := range digestFields {
			deleteAnyCase(v.header, f) // they describe the identity bytes
		}
		return v, nil
	}
	deleteAnyCase(v.header, "Content-Encoding")
	v.body = nil
	if plain == nil && precondition(r, v) == 0 {
		var err error
		if plain, err = gunzip(e.body, h.cfg.MaxBodyBytes); err != nil {
			return nil, err
		}
	}
	v.body = plain
	return v, nil
}

// gzipWriters (one pool per level, *gzip.Writer) and gzipReaders
// (*gzip.Reader) keep the large state of compressors and decompressors
// between uses.
var (
	gzipWriters [gzip.BestCompression + 1]sync.Pool
	gzipReaders sync.Pool
)

// gzipBytes compresses p at level (1 to 9).
func gzipBytes(p []byte, level int) []byte {
	var b bytes.Buffer
	b.Grow(len(p)/4 + 64)
	pool := &gzipWriters[level]
	zw, _ := pool.Get().(*gzip.Writer)
	if zw == nil {
		zw, _ = gzip.NewWriterLevel(&b, level) // level is valid (resolve)
	} else {
		zw.Reset(&b)
	}
	_, _ = zw.Write(p) // a bytes.Buffer does not fail
	_ = zw.Close()
	zw.Reset(nil) // do not keep b alive from the pool
	pool.Put(zw)
	return b.Bytes()
}

var errGzipTooLarge = errors.New("decodes to more than MaxBodyBytes")

// gunzip decodes the gzip stream p (every member of it, checksums
// verified), allocating at most limit+1 bytes for the result: a stream
// that decodes to more than limit bytes is an error. The result is never
// nil.
func gunzip(p []byte, limit int) ([]byte, error) {
	hint := limit
	if len(p) >= 4 {
		// The size of the last member's input, mod 2^32: a hint only.
		hint = min(hint, int(binary.LittleEndian.Uint32(p[len(p)-4:])))
	}
	out := make([]byte, 0, hint+1)
	br := bytes.NewReader(p)
	zr, _ := gzipReaders.Get().(*gzip.Reader)
	var err error
	if zr == nil {
		zr, err = gzip.NewReader(br)
	} else {
		err = zr.Reset(br)
	}
	if err != nil {
		return nil, fmt.Errorf("not a gzip stream: %w", err)
	}
	defer gzipReaders.Put(zr)
	for {
		if len(out) == cap(out) {
			if len(out) > limit {
				return nil, errGzipTooLarge
			}
			grown := make([]byte, len(out), min(max(2*cap(out), 512), limit+1))
			copy(grown, out)
			out = grown
		}
		n, err := zr.Read(out[len(out):cap(out)])
		out = out[:len(out)+n]
		if len(out) > limit {
			return nil, errGzipTooLarge
		}
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("not a gzip stream: %w", err)
		}
	}
}
