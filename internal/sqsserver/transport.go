package sqsserver

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
)

// BufferedBodies is an http.RoundTripper for SDK clients of a Server: it
// reads each request body into memory and sends that copy, so that a
// request never reaches the wire through the SDK's own body wrapper.
//
// Why: smithy-go closes its wrapper (a safeReadCloser) as soon as
// http.Client.Do returns, and after that the wrapper's WriteTo answers
// io.EOF. net/http writes a body of unknown kind straight to the socket
// and only then reads it once more to check for extra bytes. Against a
// server as fast as this one, the response can arrive in between: Do
// returns, smithy closes the body, the extra read gets io.EOF, the
// Transport takes it for a failed write and closes the connection under
// the response being read, and the SDK retries the operation
// (net.ErrClosed is retryable). A retried ReceiveMessage leaves the
// messages of the lost answer in flight until their visibility timeout,
// and a retried SendMessage sends twice, which makes tests flaky. With an
// in-memory body the extra read finds nothing and nothing is closed.
type BufferedBodies struct {
	Base http.RoundTripper // http.DefaultTransport when nil
}

// RoundTrip implements http.RoundTripper.
func (b BufferedBodies) RoundTrip(r *http.Request) (*http.Response, error) {
	base := b.base()
	if r.Body == nil || r.Body == http.NoBody {
		return base.RoundTrip(r)
	}
	body, err := io.ReadAll(r.Body)
	closeErr := r.Body.Close()
	if err == nil {
		err = closeErr
	}
	if err != nil {
		return nil, fmt.Errorf("sqsserver: buffer request body: %w", err)
	}
	clone := r.Clone(r.Context())
	clone.Body = io.NopCloser(bytes.NewReader(body))
	clone.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	return base.RoundTrip(clone)
}

// CloseIdleConnections closes the idle connections of Base, so that
// http.Client.CloseIdleConnections reaches them.
func (b BufferedBodies) CloseIdleConnections() {
	type closeIdler interface{ CloseIdleConnections() }
	if c, ok := b.base().(closeIdler); ok {
		c.CloseIdleConnections()
	}
}

func (b BufferedBodies) base() http.RoundTripper {
	if b.Base == nil {
		return http.DefaultTransport
	}
	return b.Base
}
