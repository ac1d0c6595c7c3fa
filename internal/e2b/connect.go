package e2b

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/corralrun/corral/internal/errdefs"
)

// This file implements the server side of the Connect protocol
// (https://connectrpc.com/docs/protocol) for the envd services, over
// HTTP/1.1 or HTTP/2:
//
//   - Unary: "POST /<service>/<method>" with Content-Type application/json
//     or application/proto and the message as the body; success is 200 with
//     the response message, failure an HTTP status with the JSON body
//     {"code": "not_found", "message": "..."}.
//   - Streaming: Content-Type application/connect+json or +proto; every
//     message in either direction is an envelope, "a 1-byte flags field
//     followed by a 4-byte big-endian length and the message"; flag 0x01
//     marks a compressed message, flag 0x02 the end-of-stream message,
//     which is always JSON: {"error": {...}} on failure, {} otherwise. The
//     HTTP status of a stream is 200 even when it fails.
//   - "Connect-Timeout-Ms" bounds the call; compression "gzip" is accepted
//     on requests (Content-Encoding for unary, Connect-Content-Encoding for
//     streams); responses are never compressed.

const (
	// maxMessage bounds one request message (SendInput carries stdin).
	maxMessage     = 32 << 20
	flagCompressed = 0x01
	flagEndStream  = 0x02
)

// codec is the encoding of one call: JSON, or binary protobuf.
type codec struct{ proto bool }

func (c codec) decode(data []byte, m request) error {
	if c.proto {
		return parseProto(data, m)
	}
	return decodeJSON(data, m)
}

func (c codec) encode(m response) ([]byte, error) {
	if c.proto {
		return appendProto(nil, m), nil
	}
	return json.Marshal(m)
}

func (c codec) name() string {
	if c.proto {
		return "proto"
	}
	return "json"
}

// rpcKind is the shape of a method.
type rpcKind int

const (
	unary rpcKind = iota + 1
	serverStream
	clientStream
)

// rpcMethod serves one Connect procedure. Exactly one of the functions is
// set, matching kind.
type rpcMethod struct {
	kind   rpcKind
	unary  func(ctx context.Context, c *call) (response, error)
	stream func(ctx context.Context, c *call, out *stream) error
	// client reads the request stream from in (one message per call).
	client func(ctx context.Context, c *call, in func(request) (bool, error)) (response, error)
}

// call is one request to an envd method.
type call struct {
	sandbox string
	codec   codec
	header  http.Header
	body    []byte // the request message of unary and server-streaming calls
}

// decode reads the request message into m.
func (c *call) decode(m request) error {
	if err := c.codec.decode(c.body, m); err != nil {
		return fmt.Errorf("decoding request: %w", err)
	}
	return nil
}

// serveRPC dispatches one Connect call for sandbox id.
func (s *Server) serveRPC(w http.ResponseWriter, r *http.Request, id string) {
	m, ok := s.rpcs[r.URL.Path]
	if !ok {
		s.writeRPCError(w, r, errdefs.Errorf(errdefs.ErrNotImplemented, "envd method %s is not implemented by Corral", strings.TrimPrefix(r.URL.Path, "/")))
		return
	}
	if r.Method != http.MethodPost {
		s.writeRPCError(w, r, errdefs.Errorf(errdefs.ErrNotImplemented, "envd method %s: only POST is supported, not %s", strings.TrimPrefix(r.URL.Path, "/"), r.Method))
		return
	}
	streaming, cdc, err := contentType(r.Header.Get("Content-Type"))
	if err != nil {
		w.Header().Set("Accept-Post", "application/json, application/proto, application/connect+json, application/connect+proto")
		http.Error(w, err.Error(), http.StatusUnsupportedMediaType)
		return
	}
	if streaming != (m.kind != unary) {
		s.writeRPCError(w, r, errdefs.Errorf(errdefs.ErrInvalidArgument, "envd method %s: content type %s does not fit a %s method",
			strings.TrimPrefix(r.URL.Path, "/"), r.Header.Get("Content-Type"), map[bool]string{true: "streaming", false: "unary"}[m.kind != unary]))
		return
	}
	ctx := r.Context()
	if v := r.Header.Get("Connect-Timeout-Ms"); v != "" {
		ms, err := strconv.ParseInt(v, 10, 64)
		if err != nil || ms <= 0 {
			s.writeRPCError(w, r, errdefs.Errorf(errdefs.ErrInvalidArgument, "invalid Connect-Timeout-Ms %q", v))
			return
		}
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(ms)*time.Millisecond)
		defer cancel()
	}
	if m.kind != unary {
		var release func()
		ctx, release = s.streamContext(ctx)
		defer release()
	}
	c := &call{sandbox: id, codec: cdc, header: r.Header}
	switch m.kind {
	case unary:
		body, err := readUnary(r)
		if err != nil {
			s.writeRPCError(w, r, err)
			return
		}
		c.body = body
		resp, err := m.unary(ctx, c)
		if err != nil {
			s.writeRPCError(w, r, err)
			return
		}
		data, err := cdc.encode(resp)
		if err != nil {
			s.writeRPCError(w, r, fmt.Errorf("encoding response: %w", err))
			return
		}
		w.Header().Set("Content-Type", "application/"+cdc.name())
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(data)
	case serverStream:
		out := newStream(w, cdc)
		in := envelopeReader{r: r.Body, compressed: r.Header.Get("Connect-Content-Encoding")}
		body, ok, err := in.next()
		if err == nil && !ok {
			err = errdefs.Errorf(errdefs.ErrInvalidArgument, "the request stream holds no message")
		}
		if err == nil {
			c.body = body
			err = closedCause(ctx, m.stream(ctx, c, out))
		}
		out.finish(s.redact(r, err))
	case clientStream:
		out := newStream(w, cdc)
		in := envelopeReader{r: r.Body, compressed: r.Header.Get("Connect-Content-Encoding")}
		resp, err := m.client(ctx, c, func(msg request) (bool, error) {
			data, ok, err := in.next()
			if err != nil || !ok {
				return false, err
			}
			if err := cdc.decode(data, msg); err != nil {
				return false, fmt.Errorf("decoding request: %w", err)
			}
			return true, nil
		})
		if err == nil {
			err = out.send(resp)
		}
		out.finish(s.redact(r, closedCause(ctx, err)))
	}
}

// streamContext returns ctx, ended also when the Server closes (streams
// may last for hours), and a function that releases it and waits for the
// goroutine that watches for the close.
func (s *Server) streamContext(ctx context.Context) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		select {
		case <-s.closing:
			cancel(unavailable("the E2B API is shutting down"))
		case <-ctx.Done():
		}
	}()
	return ctx, func() {
		cancel(nil)
		<-exited
	}
}

// closedCause replaces the cancellation error of a stream ended by Close
// with the reason, so the client reads "unavailable", not "canceled".
func closedCause(ctx context.Context, err error) error {
	if cause := context.Cause(ctx); err != nil && errors.Is(cause, errdefs.ErrUnavailable) {
		return cause
	}
	return err
}

// contentType parses a Connect content type.
func contentType(v string) (streaming bool, c codec, err error) {
	mt, _, err := mime.ParseMediaType(v)
	if err != nil {
		return false, codec{}, fmt.Errorf("invalid content type %q", v)
	}
	switch mt {
	case "application/json":
		return false, codec{}, nil
	case "application/proto":
		return false, codec{proto: true}, nil
	case "application/connect+json":
		return true, codec{}, nil
	case "application/connect+proto":
		return true, codec{proto: true}, nil
	}
	return false, codec{}, fmt.Errorf("unsupported content type %q: use application/json, application/proto or their application/connect+ streaming forms", v)
}

// readUnary reads a unary request body, decompressing it if needed.
func readUnary(r *http.Request) ([]byte, error) {
	var body io.Reader = http.MaxBytesReader(nil, r.Body, maxMessage)
	switch enc := r.Header.Get("Content-Encoding"); enc {
	case "", "identity":
	case "gzip":
		zr, err := gzip.NewReader(body)
		if err != nil {
			return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "reading gzip request: %v", err)
		}
		body = io.LimitReader(zr, maxMessage+1)
	default:
		return nil, errdefs.Errorf(errdefs.ErrNotImplemented, "request compression %q is not supported (use gzip or identity)", enc)
	}
	data, err := io.ReadAll(body)
	if err != nil {
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "reading request: %v", err)
	}
	if len(data) > maxMessage {
		return nil, errdefs.Errorf(errdefs.ErrResourceExhausted, "request message larger than %d bytes", maxMessage)
	}
	return data, nil
}

// envelopeReader reads the enveloped messages of a streaming request.
type envelopeReader struct {
	r          io.Reader
	compressed string // the Connect-Content-Encoding of the request
}

// next returns the next message; ok is false at the end of the stream.
func (e envelopeReader) next() (data []byte, ok bool, err error) {
	var hdr [5]byte
	if _, err := io.ReadFull(e.r, hdr[:]); err != nil {
		if err == io.EOF {
			return nil, false, nil
		}
		return nil, false, errdefs.Errorf(errdefs.ErrInvalidArgument, "reading request envelope: %v", err)
	}
	n := binary.BigEndian.Uint32(hdr[1:])
	if n > maxMessage {
		return nil, false, errdefs.Errorf(errdefs.ErrResourceExhausted, "request message of %d bytes is larger than %d", n, maxMessage)
	}
	data = make([]byte, n)
	if _, err := io.ReadFull(e.r, data); err != nil {
		return nil, false, errdefs.Errorf(errdefs.ErrInvalidArgument, "reading request message: %v", err)
	}
	if hdr[0]&flagEndStream != 0 {
		return nil, false, nil // clients do not send one, but it ends the stream
	}
	if hdr[0]&flagCompressed != 0 {
		if e.compressed != "gzip" {
			return nil, false, errdefs.Errorf(errdefs.ErrInvalidArgument, "compressed message with Connect-Content-Encoding %q (only gzip is supported)", e.compressed)
		}
		zr, err := gzip.NewReader(bytes.NewReader(data))
		if err != nil {
			return nil, false, errdefs.Errorf(errdefs.ErrInvalidArgument, "reading gzip message: %v", err)
		}
		if data, err = io.ReadAll(io.LimitReader(zr, maxMessage+1)); err != nil {
			return nil, false, errdefs.Errorf(errdefs.ErrInvalidArgument, "reading gzip message: %v", err)
		}
	}
	return data, true, nil
}

// stream writes the response side of a streaming call. send and
// keepalives may be called from different goroutines; writes are
// serialized and each message is flushed at once.
type stream struct {
	codec codec
	w     http.ResponseWriter
	rc    *http.ResponseController

	mu      sync.Mutex
	started bool
	err     error // the first write error; later sends fail with it
}

func newStream(w http.ResponseWriter, c codec) *stream {
	return &stream{codec: c, w: w, rc: http.NewResponseController(w)}
}

// send writes one message.
func (s *stream) send(m response) error {
	data, err := s.codec.encode(m)
	if err != nil {
		return fmt.Errorf("encoding message: %w", err)
	}
	return s.write(0, data)
}

func (s *stream) write(flags byte, data []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return s.err
	}
	if !s.started {
		s.started = true
		s.w.Header().Set("Content-Type", "application/connect+"+s.codec.name())
		s.w.WriteHeader(http.StatusOK)
	}
	var hdr [5]byte
	hdr[0] = flags
	binary.BigEndian.PutUint32(hdr[1:], uint32(len(data)))
	if _, err := s.w.Write(append(hdr[:], data...)); err != nil {
		s.err = fmt.Errorf("writing stream: %w", err)
		return s.err
	}
	if err := s.rc.Flush(); err != nil {
		s.err = fmt.Errorf("flushing stream: %w", err)
		return s.err
	}
	return nil
}

// finish writes the end-of-stream message carrying err, if any.
func (s *stream) finish(err error) {
	end := struct {
		Error *connectError `json:"error,omitempty"`
	}{}
	if err != nil {
		ce := toConnectError(err)
		end.Error = &ce
	}
	data, _ := json.Marshal(end)
	_ = s.write(flagEndStream, data)
}

// keepalive sends m every interval, as E2B's envd does when a client asks
// with the Keepalive-Ping-Interval header (seconds): the SDKs abort a
// stream that stays silent for their request timeout. It returns a
// function that stops the sender and waits for it; interval <= 0 starts
// nothing.
func (s *stream) keepalive(interval time.Duration, m response) (stop func()) {
	if interval <= 0 {
		return func() {}
	}
	done, exited := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(exited)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				if s.send(m) != nil {
					return
				}
			}
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() { close(done) })
		<-exited
	}
}

// keepaliveInterval reads the Keepalive-Ping-Interval header (seconds).
func keepaliveInterval(h http.Header) time.Duration {
	v, err := strconv.Atoi(h.Get("Keepalive-Ping-Interval"))
	if err != nil || v <= 0 {
		return 0
	}
	return time.Duration(v) * time.Second
}

// connectError is the error body of the Connect protocol.
type connectError struct {
	Code    string `json:"code"`
	Message string `json:"message,omitempty"`
}

// toConnectError maps an error to its Connect code. Corral's kinds share
// names with Connect's codes, except not_implemented (unimplemented).
func toConnectError(err error) connectError {
	code := errdefs.Code(err)
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		code = "deadline_exceeded"
	case errors.Is(err, context.Canceled):
		code = "canceled"
	case code == errdefs.CodeNotImplemented:
		code = "unimplemented"
	}
	return connectError{Code: code, Message: err.Error()}
}

// connectStatus is the HTTP status of a unary error, per the protocol's
// table.
func connectStatus(code string) int {
	switch code {
	case "canceled":
		return 499
	case "invalid_argument", "failed_precondition", "out_of_range":
		return http.StatusBadRequest
	case "deadline_exceeded":
		return http.StatusGatewayTimeout
	case "not_found":
		return http.StatusNotFound
	case "already_exists", "aborted":
		return http.StatusConflict
	case "permission_denied":
		return http.StatusForbidden
	case "resource_exhausted":
		return http.StatusTooManyRequests
	case "unimplemented":
		return http.StatusNotImplemented
	case "unavailable":
		return http.StatusServiceUnavailable
	case "unauthenticated":
		return http.StatusUnauthorized
	}
	return http.StatusInternalServerError
}

// writeRPCError answers a call that fails before it is dispatched, in the
// form its content type expects, with what its client may see of err.
func (s *Server) writeRPCError(w http.ResponseWriter, r *http.Request, err error) {
	err = s.redact(r, err)
	if streaming, c, cerr := contentType(r.Header.Get("Content-Type")); cerr == nil && streaming {
		newStream(w, c).finish(err)
		return
	}
	ce := toConnectError(err)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(connectStatus(ce.Code))
	_ = json.NewEncoder(w).Encode(ce)
}
