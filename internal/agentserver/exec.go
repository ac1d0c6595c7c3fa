package agentserver

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/wire"
)

const (
	// defaultPath is the PATH a process gets unless the request sets one.
	defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	// maxExecRequest bounds an exec request body, stdin included.
	maxExecRequest = 64 << 20
)

// handleExec serves POST /exec: it starts the process, then streams its
// events until exit. The process belongs to this request: when the client
// goes away the process group is killed.
func (s *Server) handleExec(w http.ResponseWriter, r *http.Request) {
	var req wire.ExecRequest
	if err := decodeJSON(w, r, &req, maxExecRequest); err != nil {
		wire.WriteError(w, err)
		return
	}
	spec, err := s.prepare(&req)
	if err != nil {
		wire.WriteError(w, err)
		return
	}
	sub := newSubscriber()
	p, err := s.procs.start(spec, sub)
	if err != nil {
		wire.WriteError(w, err)
		return
	}
	if !streamExec(w, r, p, sub, req.MaxOutputBytes) {
		p.kill()
		sub.stop()
		<-p.done
	}
}

// truncationMarker is the line sent on stderr where an exec's output was
// cut at its limit.
func truncationMarker(limit int64) string {
	return fmt.Sprintf("\n[corral: output truncated at %d bytes]\n", limit)
}

// streamExec writes p's events to w and reports whether the client received
// them all; false means the client is gone and p must be killed. With
// limit > 0, output past limit bytes is read and counted but not sent.
func streamExec(w http.ResponseWriter, r *http.Request, p *process, sub *subscriber, limit int64) bool {
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	enc := jsonEncoder(w)
	if enc.Encode(wire.ExecEvent{Type: wire.EventStart, PID: p.pid}) != nil || rc.Flush() != nil {
		return false
	}
	ctx := r.Context()
	var sent, discarded int64
	for {
		select {
		case c, ok := <-sub.ch:
			if !ok {
				// The exit event is not flushed here: the handler returns
				// right away and the server sends it together with the end
				// of the response, saving a write.
				ev := exitEvent(p.exit)
				if discarded > 0 {
					ev.OutputTruncated, ev.OutputDiscarded = true, discarded
				}
				return enc.Encode(ev) == nil
			}
			typ := wire.EventStdout
			if c.stream == streamStderr {
				typ = wire.EventStderr
			}
			data := c.data
			if limit > 0 && sent+int64(len(data)) > limit {
				keep := max(limit-sent, 0)
				if discarded == 0 {
					// The first chunk over the limit: send what fits, then
					// say where the output was cut.
					if keep > 0 && enc.Encode(wire.OutputEvent(typ, data[:keep])) != nil {
						return false
					}
					if enc.Encode(wire.ExecEvent{Type: wire.EventStderr, Text: truncationMarker(limit)}) != nil {
						return false
					}
				}
				discarded += int64(len(data)) - keep
				sent += keep
			} else {
				sent += int64(len(data))
				if enc.Encode(wire.OutputEvent(typ, data)) != nil {
					return false
				}
			}
			// Flush when caught up; a burst of chunks shares one write.
			if len(sub.ch) == 0 && rc.Flush() != nil {
				return false
			}
		case <-ctx.Done():
			return false
		}
	}
}

func exitEvent(st exitStatus) wire.ExecEvent {
	if st.lost {
		return wire.ExecEvent{Type: wire.EventError, TimedOut: st.timedOut, Error: &wire.ErrorDetail{
			Code: errdefs.CodeInternal, Message: "exit status of the process was lost",
		}}
	}
	code := st.code
	return wire.ExecEvent{Type: wire.EventExit, ExitCode: &code, Signal: st.signal, TimedOut: st.timedOut}
}

// prepare validates an exec request and resolves everything a process
// needs before it is forked, so that failures become errors with the
// right kind rather than an errno from the child.
func (s *Server) prepare(req *wire.ExecRequest) (procSpec, error) {
	return s.prepareWith(req, nil)
}

// prepareStart is prepare for a process that outlives its request.
func (s *Server) prepareStart(req *wire.StartRequest) (procSpec, error) {
	spec, err := s.prepareWith(&req.ExecRequest, req.PTY)
	if err != nil {
		return procSpec{}, err
	}
	spec.background = true
	spec.openStdin = req.OpenStdin
	spec.user = req.User
	spec.tag = req.Tag
	return spec, nil
}

// prepareWith validates req for a process on the terminal term (nil: on
// pipes). Without a command, a terminal runs the user's login shell.
func (s *Server) prepareWith(req *wire.ExecRequest, term *wire.PTYSize) (procSpec, error) {
	var argv []string
	switch {
	case len(req.Cmd) > 0 && req.Shell != "":
		return procSpec{}, errorf(errdefs.ErrInvalidArgument, "exec request sets both cmd and shell")
	case len(req.Cmd) > 0:
		argv = req.Cmd
	case req.Shell != "":
		argv = []string{"/bin/sh", "-c", req.Shell}
	case term == nil:
		return procSpec{}, errorf(errdefs.ErrInvalidArgument, "exec request needs cmd or shell")
	}
	if len(argv) > 0 && argv[0] == "" {
		return procSpec{}, errorf(errdefs.ErrInvalidArgument, "exec request has an empty command name")
	}
	if req.TimeoutMS < 0 {
		return procSpec{}, errorf(errdefs.ErrInvalidArgument, "timeout_ms must not be negative")
	}
	acct, err := s.lookupAccount(req.User)
	if err != nil {
		return procSpec{}, err
	}
	env, err := buildEnv(acct, req.Env)
	if err != nil {
		return procSpec{}, err
	}
	if _, ok := req.Env["TERM"]; term != nil && !ok {
		env = append(env, "TERM="+defaultTerm)
	}
	dir, err := workDir(req.Cwd, acct.home)
	if err != nil {
		return procSpec{}, err
	}
	exe := ""
	if argv == nil {
		exe, argv = loginShell(acct.shell)
	} else if exe, err = lookPath(argv[0], pathOf(env), dir); err != nil {
		return procSpec{}, err
	}
	return procSpec{
		path:    exe,
		argv:    argv,
		env:     env,
		dir:     dir,
		cred:    acct.cred,
		stdin:   req.Stdin,
		timeout: time.Duration(req.TimeoutMS) * time.Millisecond,
		term:    term,
	}, nil
}

// loginShell returns the executable and argv of a login shell: the
// account's shell when it exists, else /bin/sh, with argv[0] prefixed by
// "-" as login(1) does, which makes every common shell read its profile.
func loginShell(shell string) (exe string, argv []string) {
	exe = "/bin/sh"
	if shell != "" && filepath.IsAbs(shell) {
		if fi, err := os.Stat(shell); err == nil && fi.Mode().IsRegular() {
			exe = shell
		}
	}
	return exe, []string{"-" + filepath.Base(exe)}
}

// buildEnv starts from a small sane environment and lets the request
// override and extend it. The result is sorted by request key after the
// base variables, so a given request always yields the same environment.
func buildEnv(acct account, extra map[string]string) ([]string, error) {
	env := make([]string, 0, 3+len(extra))
	env = append(env, "PATH="+defaultPath, "HOME="+acct.home)
	if acct.name != "" {
		env = append(env, "USER="+acct.name)
	}
	keys := make([]string, 0, len(extra))
	for k := range extra {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return nil, errorf(errdefs.ErrInvalidArgument, "invalid environment variable name %q", k)
		}
		keys = append(keys, k)
	}
	slices.Sort(keys)
	base := len(env)
	for _, k := range keys {
		prefix := k + "="
		if i := slices.IndexFunc(env[:base], func(e string) bool { return strings.HasPrefix(e, prefix) }); i >= 0 {
			env[i] = prefix + extra[k]
			continue
		}
		env = append(env, prefix+extra[k])
	}
	return env, nil
}

// pathOf returns the PATH value of env.
func pathOf(env []string) string {
	for _, e := range env {
		if v, ok := strings.CutPrefix(e, "PATH="); ok {
			return v
		}
	}
	return ""
}

// workDir returns the directory a process starts in: cwd when given (it
// must be an existing absolute directory), else home if it is a
// directory, else "/".
func workDir(cwd, home string) (string, error) {
	if cwd == "" {
		if fi, err := os.Stat(home); err == nil && fi.IsDir() {
			return home, nil
		}
		return "/", nil
	}
	if !filepath.IsAbs(cwd) {
		return "", errorf(errdefs.ErrInvalidArgument, "cwd %s must be absolute", cwd)
	}
	fi, err := os.Stat(cwd)
	if err != nil {
		return "", errorf(errdefs.ErrInvalidArgument, "cwd %s: %v", cwd, errnoText(err))
	}
	if !fi.IsDir() {
		return "", errorf(errdefs.ErrInvalidArgument, "cwd %s is not a directory", cwd)
	}
	return cwd, nil
}

// lookPath resolves a command name without a slash through PATH, like a
// shell: the first regular file with an execute bit wins. Names with a
// slash are used as they are (relative to dir), and execve reports what is
// wrong with them.
func lookPath(name, pathList, dir string) (string, error) {
	if strings.Contains(name, "/") {
		return name, nil
	}
	denied := false
	for _, d := range filepath.SplitList(pathList) {
		if d == "" {
			d = "."
		}
		p := filepath.Join(d, name)
		if !filepath.IsAbs(p) {
			p = filepath.Join(dir, p)
		}
		fi, err := os.Stat(p)
		if err != nil {
			denied = denied || errors.Is(err, os.ErrPermission)
			continue
		}
		if fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
		denied = true
	}
	if denied {
		return "", errorf(errdefs.ErrPermissionDenied, "starting %s: permission denied", name)
	}
	return "", errorf(errdefs.ErrNotFound, "starting %s: executable not found in $PATH", name)
}

// decodeJSON decodes a request body of at most limit bytes into v and reads
// the body to its end, which lets the HTTP server notice a client that goes
// away while the handler runs.
func decodeJSON(w http.ResponseWriter, r *http.Request, v any, limit int64) error {
	body := http.MaxBytesReader(w, r.Body, limit)
	if err := json.NewDecoder(body).Decode(v); err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			return errorf(errdefs.ErrInvalidArgument, "request body is larger than %d bytes", limit)
		}
		return errorf(errdefs.ErrInvalidArgument, "decoding request body: %v", err)
	}
	if _, err := io.Copy(io.Discard, body); err != nil {
		return errorf(errdefs.ErrInvalidArgument, "reading request body: %v", err)
	}
	return nil
}

// jsonEncoder returns an encoder that leaves <, > and & alone: output text
// should read in a terminal as it was written.
func jsonEncoder(w io.Writer) *json.Encoder {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	return enc
}
