package middleware

import (
	"bufio"
	"bytes"
	"errors"
	"net"
	"net/http"
	"strconv"
	"strings"
)

// captureWriter records a handler's response so it can be stored and
// shared. It buffers up to max body bytes; past that, or when the handler
// flushes or hijacks, it switches to pass-through: what was buffered is
// written to the client and the rest streams, and the response is marked
// uncacheable. It decides the response exactly once.
//
// With a nil client it only records (a background refresh, which has no
// client); pass-through then means "uncacheable" and the rest is dropped.
type captureWriter struct {
	client http.ResponseWriter // nil for a background refresh
	header http.Header
	max    int
	head   bool // a HEAD request: the body is recorded, not sent

	status      int
	wroteHeader bool
	buf         bytes.Buffer
	passthrough bool // streaming to the client: not cacheable
	hijacked    bool
	overflow    bool  // passthrough because the body outgrew max
	declared    int64 // the Content-Length the handler set when it wrote the header; -1 for none

	// onPassthrough, if set, is called once, when the response becomes
	// uncacheable (before anything more is written to the client).
	onPassthrough func()
}

func newCaptureWriter(client http.ResponseWriter, max int, head bool) *captureWriter {
	h := http.Header{}
	if client != nil {
		h = client.Header()
	}
	return &captureWriter{client: client, header: h, max: max, head: head, declared: -1}
}

func (w *captureWriter) Header() http.Header { return w.header }

func (w *captureWriter) WriteHeader(code int) {
	if w.wroteHeader || w.hijacked {
		return
	}
	if code >= 100 && code < 200 && code != http.StatusSwitchingProtocols {
		// Informational (103 Early Hints): forward, do not record.
		if w.client != nil {
			w.client.WriteHeader(code)
		}
		return
	}
	w.status, w.wroteHeader = code, true
	// What net/http holds the body to (response.WriteHeader): a larger
	// body is refused, a shorter one cuts the connection.
	if cl := strings.TrimSpace(headerGet(w.header, "Content-Length")); cl != "" {
		if n, err := strconv.ParseInt(cl, 10, 64); err == nil && n >= 0 {
			w.declared = n
		}
	}
}

func (w *captureWriter) Write(p []byte) (int, error) {
	if w.hijacked {
		return 0, http.ErrHijacked
	}
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if w.passthrough {
		return w.toClient(p)
	}
	if w.declared >= 0 && int64(w.buf.Len()+len(p)) > w.declared {
		// net/http writes what fits and refuses the rest.
		n, _ := w.Write(p[:w.declared-int64(w.buf.Len())])
		return n, http.ErrContentLength
	}
	if w.buf.Len()+len(p) > w.max {
		w.overflow = true
		if err := w.startPassthrough(); err != nil {
			return 0, err
		}
		return w.toClient(p)
	}
	return w.buf.Write(p)
}

func (w *captureWriter) toClient(p []byte) (int, error) {
	if w.client == nil || w.head {
		return len(p), nil
	}
	return w.client.Write(p)
}

// startPassthrough sends the status and what was buffered, and streams
// from then on.
func (w *captureWriter) startPassthrough() error {
	if w.passthrough {
		return nil
	}
	w.passthrough = true
	if w.onPassthrough != nil {
		w.onPassthrough()
	}
	if w.client == nil {
		return nil
	}
	detail := detailStreamed
	if w.overflow {
		detail = detailTooLarge
	}
	w.header.Set("Cache-Status", withDetail(statusBypass, detail))
	w.client.WriteHeader(w.status)
	if w.buf.Len() > 0 && !w.head {
		if _, err := w.client.Write(w.buf.Bytes()); err != nil {
			return err
		}
	}
	w.buf.Reset()
	return nil
}

// Flush makes the response a stream: it goes to the client now and is
// not cached.
func (w *captureWriter) Flush() { _ = w.FlushError() }

// FlushError is Flush for http.ResponseController.
func (w *captureWriter) FlushError() error {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if err := w.startPassthrough(); err != nil {
		return err
	}
	if w.client == nil {
		return nil
	}
	return http.NewResponseController(w.client).Flush()
}

// Hijack hands the connection to the handler; the response is not cached.
func (w *captureWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	if w.client == nil {
		return nil, nil, errors.New("herd/middleware: hijack during a background refresh")
	}
	conn, rw, err := http.NewResponseController(w.client).Hijack()
	if err == nil {
		first := !w.passthrough
		w.hijacked, w.passthrough = true, true
		if first && w.onPassthrough != nil {
			w.onPassthrough()
		}
	}
	return conn, rw, err
}

// Unwrap lets http.ResponseController reach the client's other methods
// (deadlines, full-duplex).
func (w *captureWriter) Unwrap() http.ResponseWriter { return w.client }

// truncated reports whether the recorded body is shorter than the
// Content-Length the handler declared (RFC 9111 §3.3: an incomplete
// response, never stored as complete). net/http closes the connection
// after such a response; herd sends it the same way (see lead).
func (w *captureWriter) truncated() bool {
	return !w.passthrough && w.declared >= 0 && int64(w.buf.Len()) < w.declared && bodyAllowed(w.finalStatus())
}

// bodyAllowed reports whether a response of status has a body (RFC 9110
// §6.4.1): not a 1xx, 204 or 304.
func bodyAllowed(status int) bool {
	return status >= 200 && status != http.StatusNoContent && status != http.StatusNotModified
}

// finalStatus is the recorded status (200 when the handler wrote nothing).
func (w *captureWriter) finalStatus() int {
	if !w.wroteHeader {
		return http.StatusOK
	}
	return w.status
}
