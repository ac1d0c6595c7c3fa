package server

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/corralrun/corral/internal/audit"
	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/sandbox"
	"github.com/corralrun/corral/internal/wire"
)

// Mutating reports whether requests of method change something, and so
// are recorded in the audit log.
func Mutating(method string) bool {
	switch method {
	case http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete:
		return true
	}
	return false
}

// CallAudit records the API calls that change something in an audit log,
// for this API and the E2B facade alike.
type CallAudit struct {
	// Log keeps the records; nil records nothing.
	Log *audit.Log
	// Logger receives the failures to record a call's outcome, which come
	// after the call has run and so cannot refuse it.
	Logger *slog.Logger
	// Fail answers a call refused because its record could not be stored.
	Fail func(http.ResponseWriter, *http.Request, error)
}

// Wrap returns h, for the route of pattern, recording each call (Record)
// when the pattern's method changes something (Mutating), and h itself
// otherwise.
func (a CallAudit) Wrap(pattern string, record func(*http.Request) audit.Record, h http.HandlerFunc) http.HandlerFunc {
	method, _, _ := strings.Cut(pattern, " ")
	if !Mutating(method) {
		return h
	}
	return a.Record(record, h)
}

// Record returns h recording each call: before h runs, as record makes it
// of the request (a record that cannot be stored refuses the call with
// errdefs.ErrUnavailable: nothing changes unaudited), and once h
// answered (for a WebSocket, once its session ended), again with its
// status and duration. Without a Log it returns h.
func (a CallAudit) Record(record func(*http.Request) audit.Record, h http.HandlerFunc) http.HandlerFunc {
	if a.Log == nil {
		return h
	}
	return func(w http.ResponseWriter, r *http.Request) {
		rec := record(r)
		if err := a.Log.Append(rec); err != nil {
			a.Fail(w, r, errdefs.Errorf(errdefs.ErrUnavailable, "the audit log cannot be written, so nothing that changes state runs: %v", err))
			return
		}
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w}
		h(sw, r)
		rec.Time, rec.Status = time.Time{}, sw.status
		if rec.Status == 0 {
			rec.Status = http.StatusOK
		}
		rec.DurationMS = float64(time.Since(start).Microseconds()) / 1000
		if err := a.Log.Append(rec); err != nil {
			a.Logger.Error("recording an API call's outcome in the audit log", "action", rec.Action, "err", err)
		}
	}
}

// callRecord returns the record of a call of route pattern: its caller,
// the sandbox of {id}, and the route's other names.
func callRecord(pattern string) func(*http.Request) audit.Record {
	return func(r *http.Request) audit.Record {
		rec := sandbox.AuditRecord(r.Context(), pattern, r.PathValue("id"))
		for _, name := range []string{"name", "pid", "context"} {
			if v := r.PathValue(name); v != "" {
				if rec.Detail == nil {
					rec.Detail = map[string]string{}
				}
				rec.Detail[name] = v
			}
		}
		return rec
	}
}

// statusWriter remembers the status a handler answered with. Unwrap lets
// http.ResponseController reach the connection's flush and hijack.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// auditCode records code about to run in a sandbox's interpreter: the
// SHA-256 of the code, not the code, which may hold secrets. It returns
// the function that records how the execution ended.
func (s *Server) auditCode(r *http.Request, id, code, language string) (func(err error), error) {
	if s.cfg.Audit == nil {
		return func(error) {}, nil
	}
	rec := sandbox.AuditRecord(r.Context(), "code", id)
	sum := sha256.Sum256([]byte(code))
	rec.CodeSHA256 = hex.EncodeToString(sum[:])
	if language != "" {
		rec.Detail = map[string]string{"language": language}
	}
	if err := s.cfg.Audit.Append(rec); err != nil {
		return nil, errdefs.Errorf(errdefs.ErrUnavailable, "the audit log cannot be written, so no code runs: %v", err)
	}
	start := time.Now()
	return func(err error) {
		rec.Time = time.Time{}
		rec.DurationMS = float64(time.Since(start).Microseconds()) / 1000
		if err != nil {
			rec.Error = err.Error()
		}
		if err := s.cfg.Audit.Append(rec); err != nil {
			s.log.Error("recording the end of code in the audit log", "sandbox_id", id, "err", err)
		}
	}, nil
}

// auditLog serves GET /v1/audit (admin keys only): the audit log's
// records as newline-delimited JSON, oldest first, filtered by sandbox,
// key and since (RFC 3339); with follow=true the stream then goes on with
// new records until the client leaves.
func (s *Server) auditLog(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Audit == nil {
		s.writeError(w, r, errdefs.Errorf(errdefs.ErrNotImplemented, "this server keeps no audit log"))
		return
	}
	q := r.URL.Query()
	f := audit.Filter{SandboxID: q.Get("sandbox"), Key: q.Get("key"), Tenant: q.Get("tenant"), Follow: q.Get("follow") == "true"}
	if v := q.Get("since"); v != "" {
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			s.writeError(w, r, errdefs.Errorf(errdefs.ErrInvalidArgument, "since %q: want an RFC 3339 time", v))
			return
		}
		f.Since = t
	}
	if v := q.Get("follow"); v != "" && v != "true" && v != "false" {
		s.writeError(w, r, errdefs.Errorf(errdefs.ErrInvalidArgument, "follow %q: want true or false", v))
		return
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	_ = rc.Flush()
	enc := json.NewEncoder(w)
	err := s.cfg.Audit.Query(r.Context(), f, func(rec audit.Record) error {
		if err := enc.Encode(rec); err != nil {
			return err
		}
		if f.Follow {
			return rc.Flush()
		}
		return nil
	})
	if err != nil && r.Context().Err() == nil {
		// The stream's status is sent: an error line ends it.
		_ = enc.Encode(wire.ErrorBody{Error: wire.ErrorDetail{Code: errdefs.Code(err), Message: err.Error()}})
	}
}
