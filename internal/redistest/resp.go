package redistest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"
)

// The package talks to the servers it manages through this minimal RESP2
// client rather than through go-redis, so that readiness checks neither start
// background goroutines nor depend on client configuration.

// replyError is an error reply sent by the server.
type replyError string

func (e replyError) Error() string { return "redis: " + string(e) }

// command sends one command to the server at addr on a new connection and
// returns its reply. A reply is a string, an int64, a []any, nil or, for an
// error reply, a replyError returned as the error. The whole exchange is
// bounded by timeout.
func command(addr string, timeout time.Duration, args ...string) (any, error) {
	conn, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(timeout)); err != nil {
		return nil, err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := io.WriteString(conn, b.String()); err != nil {
		return nil, err
	}
	return readReply(bufio.NewReader(conn))
}

// commandString is like command but requires a string reply.
func commandString(addr string, timeout time.Duration, args ...string) (string, error) {
	r, err := command(addr, timeout, args...)
	if err != nil {
		return "", err
	}
	s, ok := r.(string)
	if !ok {
		return "", fmt.Errorf("%s: unexpected reply %T to %s", addr, r, args[0])
	}
	return s, nil
}

// readReply reads one RESP2 reply from r.
func readReply(r *bufio.Reader) (any, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	line = strings.TrimSuffix(line, "\r\n")
	if line == "" {
		return nil, errors.New("redis: empty reply line")
	}
	body := line[1:]
	switch line[0] {
	case '+':
		return body, nil
	case '-':
		return nil, replyError(body)
	case ':':
		return strconv.ParseInt(body, 10, 64)
	case '$':
		n, err := strconv.Atoi(body)
		if err != nil {
			return nil, fmt.Errorf("redis: bad bulk length %q", body)
		}
		if n < 0 {
			return nil, nil
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return nil, err
		}
		return string(buf[:n]), nil
	case '*':
		n, err := strconv.Atoi(body)
		if err != nil {
			return nil, fmt.Errorf("redis: bad array length %q", body)
		}
		if n < 0 {
			return nil, nil
		}
		elems := make([]any, n)
		for i := range elems {
			elems[i], err = readReply(r)
			var re replyError
			if err != nil && !errors.As(err, &re) {
				return nil, err
			}
			if err != nil {
				elems[i] = re
			}
		}
		return elems, nil
	}
	return nil, fmt.Errorf("redis: unexpected reply line %q", line)
}

// infoField returns the value of field in the output of INFO or CLUSTER INFO,
// which consists of "field:value" lines.
func infoField(info, field string) (string, bool) {
	for line := range strings.SplitSeq(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && k == field {
			return v, true
		}
	}
	return "", false
}
