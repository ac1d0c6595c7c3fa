package e2b

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/corralrun/corral/internal/e2b/envdpb"
	"github.com/corralrun/corral/internal/e2b/envdpb/envdpbconnect"
	"github.com/corralrun/corral/internal/errdefs"
)

// The envd services speak the Connect protocol
// (https://connectrpc.com/docs/protocol) through connect-go, with the
// messages of envdpb, in JSON and binary protobuf, unary and streaming.
// Around connect-go, Corral keeps: its error kinds mapped to Connect codes
// and redacted as on every API; streams ended by Close with
// "unavailable"; requests gzip-compressed or not, and responses never
// compressed, so that every client reads them whatever it advertises.

// maxMessage bounds one request message (SendInput carries stdin).
const maxMessage = 32 << 20

// rpcs is the handler of the envd services and the procedures they serve.
type rpcs struct {
	handler http.Handler
	known   map[string]bool // "/<service>/<method>"
	errors  *connect.ErrorWriter
}

func (s *Server) newRPCs() rpcs {
	opts := []connect.HandlerOption{
		connect.WithReadMaxBytes(maxMessage),
		connect.WithCompressMinBytes(math.MaxInt),
		connect.WithCodec(protoCodec{}),
		connect.WithCodec(jsonCodec{}),
		connect.WithInterceptors(rpcErrors{s}),
	}
	mux := http.NewServeMux()
	mux.Handle(envdpbconnect.NewProcessHandler(processService{s}, opts...))
	mux.Handle(envdpbconnect.NewFilesystemHandler(filesystemService{s}, opts...))
	known := map[string]bool{}
	for _, fd := range []protoreflect.FileDescriptor{envdpb.File_process_proto, envdpb.File_filesystem_proto} {
		for i := range fd.Services().Len() {
			svc := fd.Services().Get(i)
			for j := range svc.Methods().Len() {
				known["/"+string(svc.FullName())+"/"+string(svc.Methods().Get(j).Name())] = true
			}
		}
	}
	return rpcs{handler: mux, known: known, errors: connect.NewErrorWriter(opts...)}
}

// rpcCallKey is the context key of the rpcCall of a request.
type rpcCallKey struct{}

// rpcCall is what the envd handlers need of the HTTP request beyond the
// message: the sandbox it addresses, and the request for redaction.
type rpcCall struct {
	sandbox string
	r       *http.Request
}

// callOf returns the rpcCall that serveRPC put in ctx.
func callOf(ctx context.Context) rpcCall {
	c, _ := ctx.Value(rpcCallKey{}).(rpcCall)
	return c
}

// serveRPC serves one Connect call for sandbox id.
func (s *Server) serveRPC(w http.ResponseWriter, r *http.Request, id string) {
	name := strings.TrimPrefix(r.URL.Path, "/")
	if !s.rpcs.known[r.URL.Path] {
		s.writeRPCError(w, r, errdefs.Errorf(errdefs.ErrNotImplemented, "envd method %s is not implemented by Corral", name))
		return
	}
	if r.Method != http.MethodPost {
		s.writeRPCError(w, r, errdefs.Errorf(errdefs.ErrNotImplemented, "envd method %s: only POST is supported, not %s", name, r.Method))
		return
	}
	ctx := context.WithValue(r.Context(), rpcCallKey{}, rpcCall{sandbox: id, r: r})
	s.rpcs.handler.ServeHTTP(w, r.WithContext(ctx))
}

// writeRPCError answers a call that fails before it is dispatched, in the
// form its content type expects, with what its client may see of err.
func (s *Server) writeRPCError(w http.ResponseWriter, r *http.Request, err error) {
	_ = s.rpcs.errors.Write(w, r, connectError(s.redact(r, err)))
}

// rpcErrors is the interceptor that turns the errors of the envd handlers
// into Connect errors, redacted, and that ends streams when the Server
// closes.
type rpcErrors struct{ s *Server }

func (i rpcErrors) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		resp, err := next(ctx, req)
		if err != nil {
			return nil, i.s.rpcError(ctx, err)
		}
		return resp, nil
	}
}

func (rpcErrors) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (i rpcErrors) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		ctx, release := i.s.streamContext(ctx)
		defer release()
		return i.s.rpcError(ctx, closedCause(ctx, next(ctx, conn)))
	}
}

// rpcError is err as the client of the call in ctx may see it. An error
// of connect-go's own (a message that does not parse) is already one.
func (s *Server) rpcError(ctx context.Context, err error) error {
	var ce *connect.Error
	if err == nil || errors.As(err, &ce) {
		return err
	}
	if c := callOf(ctx); c.r != nil {
		err = s.redact(c.r, err)
	}
	return connectError(err)
}

// connectError maps an error to its Connect code. Corral's kinds share
// names with Connect's codes, except not_implemented (unimplemented) and
// busy, which Connect has no name for (unknown).
func connectError(err error) *connect.Error {
	code := connect.CodeUnknown
	switch name := errdefs.Code(err); {
	case errors.Is(err, context.DeadlineExceeded):
		code = connect.CodeDeadlineExceeded
	case errors.Is(err, context.Canceled):
		code = connect.CodeCanceled
	case name == errdefs.CodeNotImplemented:
		code = connect.CodeUnimplemented
	default:
		_ = code.UnmarshalText([]byte(name)) // leaves code unknown when it fails
	}
	return connect.NewError(code, err)
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

// closedCause replaces the cancellation error of a stream ended by Close,
// or by the revocation of its API key, with the reason, so the client
// reads "unavailable" or "unauthenticated", not "canceled".
func closedCause(ctx context.Context, err error) error {
	if cause := context.Cause(ctx); err != nil && (errors.Is(cause, errdefs.ErrUnavailable) || errors.Is(cause, errdefs.ErrUnauthenticated)) {
		return cause
	}
	return err
}

// sender serializes the sends of one response stream: connect-go's
// streams must not be written from two goroutines at once, and keepalives
// come from a goroutine of their own.
type sender[T any] struct {
	mu   sync.Mutex
	send func(T) error
}

func (s *sender[T]) Send(m T) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.send(m)
}

// keepalive sends m every interval, as E2B's envd does when a client asks
// with the Keepalive-Ping-Interval header (seconds): the SDKs abort a
// stream that stays silent for their request timeout. It returns a
// function that stops the sender and waits for it; interval <= 0 starts
// nothing.
func (s *sender[T]) keepalive(interval time.Duration, m T) (stop func()) {
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
				if s.Send(m) != nil {
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

// protoCodec is the binary codec, whose errors name the field that does
// not parse, so that a client can find the fault in what it sent.
type protoCodec struct{}

func (protoCodec) Name() string { return "proto" }

func (protoCodec) Marshal(m any) ([]byte, error) { return proto.Marshal(m.(proto.Message)) }

func (protoCodec) Unmarshal(b []byte, m any) error {
	msg := m.(proto.Message)
	if err := proto.Unmarshal(b, msg); err != nil {
		if ferr := fieldError(b, msg.ProtoReflect().Descriptor()); ferr != nil {
			err = ferr
		}
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "invalid protobuf message: %v", err)
	}
	return nil
}

// fieldError returns the first malformed field of b, a message of type md,
// as "field N: " for each level of nesting, then the fault; nil when the
// wire format holds.
func fieldError(b []byte, md protoreflect.MessageDescriptor) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return fmt.Errorf("field tag: %w", protowire.ParseError(n))
		}
		b = b[n:]
		fd := md.Fields().ByNumber(num)
		if fd != nil && fd.Message() != nil && typ == protowire.BytesType {
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return fmt.Errorf("field %d: %w", num, protowire.ParseError(n))
			}
			if err := fieldError(v, fd.Message()); err != nil {
				return fmt.Errorf("field %d: %w", num, err)
			}
			b = b[n:]
			continue
		}
		if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
			return fmt.Errorf("field %d: %w", num, protowire.ParseError(n))
		}
		b = b[n:]
	}
	return nil
}

// jsonCodec is the canonical proto3 JSON mapping, which also accepts the
// snake_case field names. Unknown fields are ignored, so that clients
// with a newer schema keep working, and an empty body is read as the
// empty message, which is what a client means by it.
type jsonCodec struct{}

func (jsonCodec) Name() string { return "json" }

func (jsonCodec) Marshal(m any) ([]byte, error) { return protojson.Marshal(m.(proto.Message)) }

func (jsonCodec) Unmarshal(b []byte, m any) error {
	if len(strings.TrimSpace(string(b))) == 0 {
		return nil
	}
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(b, m.(proto.Message)); err != nil {
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "invalid JSON message: %v", err)
	}
	return nil
}
