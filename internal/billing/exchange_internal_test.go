package billing

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptrace"
	"strings"
	"syscall"
	"testing"
)

// TestSendCountsUnreportedWrites: an attempt that got a connection is unwritten only
// once its write is reported failed. HTTP/2 reports a write after flushing it, on a
// goroutine of its own, so RoundTrip can return on a deadline with the request on the
// wire and no report yet: that is ambiguous, never "never reached the provider".
func TestSendCountsUnreportedWrites(t *testing.T) {
	refused := &netOpError{}
	for _, c := range []struct {
		name  string
		steps func(tr *httptrace.ClientTrace)
		err   error
		want  Class
	}{
		{"no connection at all", func(tr *httptrace.ClientTrace) { getConn(tr) }, refused, Transient},
		{"a connection, the write failed", func(tr *httptrace.ClientTrace) {
			getConn(tr)
			gotConn(tr)
			wroteRequest(tr, errors.New("broken pipe"))
		}, refused, Transient},
		{"a connection, the write not reported yet (HTTP/2 on a deadline)", func(tr *httptrace.ClientTrace) {
			getConn(tr)
			gotConn(tr)
		}, context.DeadlineExceeded, Ambiguous},
		{"written, then the resend's dial refused", func(tr *httptrace.ClientTrace) {
			getConn(tr)
			gotConn(tr)
			wroteRequest(tr, nil)
			getConn(tr)
		}, refused, Ambiguous},
		{"a failed write, then a second connection not reported", func(tr *httptrace.ClientTrace) {
			getConn(tr)
			gotConn(tr)
			wroteRequest(tr, errors.New("broken pipe"))
			getConn(tr)
			gotConn(tr)
		}, context.DeadlineExceeded, Ambiguous},
	} {
		req, _ := http.NewRequest(http.MethodPost, "http://provider.test/settlements", strings.NewReader("{}"))
		_, err := send(req, true, func(r *http.Request) (*http.Response, error) {
			c.steps(httptrace.ContextClientTrace(r.Context()))
			return nil, c.err
		})
		if e, ok := AsError(err); !ok || e.Class != c.want {
			t.Errorf("%s: %v, want %s", c.name, err, c.want)
		}
	}
}

// The hooks a transport calls, when send set them.
func getConn(tr *httptrace.ClientTrace) {
	if tr.GetConn != nil {
		tr.GetConn("provider.test:80")
	}
}

func gotConn(tr *httptrace.ClientTrace) {
	if tr.GotConn != nil {
		tr.GotConn(httptrace.GotConnInfo{})
	}
}

func wroteRequest(tr *httptrace.ClientTrace, err error) {
	if tr.WroteRequest != nil {
		tr.WroteRequest(httptrace.WroteRequestInfo{Err: err})
	}
}

// netOpError is a refused dial, as net reports it.
type netOpError struct{}

func (*netOpError) Error() string { return "dial tcp: connect: connection refused" }
func (*netOpError) Unwrap() error { return syscall.ECONNREFUSED }
