package e2b

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"io"
	"net/http"
	"path"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/corralrun/corral/internal/agent"
	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/server"
	"github.com/corralrun/corral/internal/wire"
)

// This file serves E2B's process.Process service on the agent's process
// API. E2B process IDs are the agent's PIDs. Processes keep running when a
// stream ends (as in envd); Connect replays the output the agent still
// buffers, then follows it.

func (s *Server) rpcMethods() map[string]rpcMethod {
	u := func(f func(context.Context, *call) (response, error)) rpcMethod {
		return rpcMethod{kind: unary, unary: f}
	}
	st := func(f func(context.Context, *call, *stream) error) rpcMethod {
		return rpcMethod{kind: serverStream, stream: f}
	}
	return map[string]rpcMethod{
		"/process.Process/List":        u(s.processList),
		"/process.Process/Start":       st(s.processStart),
		"/process.Process/Connect":     st(s.processConnect),
		"/process.Process/Update":      u(s.processUpdate),
		"/process.Process/SendInput":   u(s.processSendInput),
		"/process.Process/StreamInput": {kind: clientStream, client: s.processStreamInput},
		"/process.Process/SendSignal":  u(s.processSendSignal),
		"/process.Process/CloseStdin":  u(s.processCloseStdin),

		"/filesystem.Filesystem/Stat":             u(s.fsStat),
		"/filesystem.Filesystem/MakeDir":          u(s.fsMakeDir),
		"/filesystem.Filesystem/Move":             u(s.fsMove),
		"/filesystem.Filesystem/ListDir":          u(s.fsListDir),
		"/filesystem.Filesystem/Remove":           u(s.fsRemove),
		"/filesystem.Filesystem/WatchDir":         st(s.fsWatchDir),
		"/filesystem.Filesystem/CreateWatcher":    u(s.watchers.create),
		"/filesystem.Filesystem/GetWatcherEvents": u(s.watchers.events),
		"/filesystem.Filesystem/RemoveWatcher":    u(s.watchers.remove),
	}
}

// userOf returns the user a call runs as: envd reads it from HTTP Basic
// authentication with an empty password ("Authorization: Basic
// base64(user:)"). Empty means the sandbox's default user (root in
// Corral; E2B's default is "user").
func userOf(h http.Header) string {
	auth, ok := server.Credentials(h, "Basic")
	if !ok {
		return ""
	}
	raw, err := base64.StdEncoding.DecodeString(auth)
	if err != nil {
		return ""
	}
	user, _, _ := strings.Cut(string(raw), ":")
	return user
}

// home is the home directory of user, against which envd resolves
// relative paths: /root for root (Corral's default user), /home/<user>
// otherwise.
func home(user string) string {
	if user == "" || user == "root" {
		return "/root"
	}
	return "/home/" + user
}

// resolvePath makes p absolute the way envd does: "~" and relative paths
// are taken from the user's home directory.
func resolvePath(p, user string) string {
	switch {
	case p == "" || p == "~":
		return home(user)
	case strings.HasPrefix(p, "~/"):
		return path.Join(home(user), p[2:])
	case !path.IsAbs(p):
		return path.Join(home(user), p)
	}
	return path.Clean(p)
}

// pidOf returns the process a selector names: by pid, or the newest running
// process with the tag.
func pidOf(ctx context.Context, cl *agent.Client, sel processSelector) (wire.ProcessInfo, error) {
	switch {
	case sel.PID != nil:
		return cl.Process(ctx, int(*sel.PID))
	case sel.Tag != nil:
		infos, err := cl.Processes(ctx)
		if err != nil {
			return wire.ProcessInfo{}, err
		}
		for i := len(infos) - 1; i >= 0; i-- {
			if infos[i].Tag == *sel.Tag && infos[i].Running {
				return infos[i], nil
			}
		}
		return wire.ProcessInfo{}, errdefs.Errorf(errdefs.ErrNotFound, "no running process has tag %q", *sel.Tag)
	}
	return wire.ProcessInfo{}, errdefs.Errorf(errdefs.ErrInvalidArgument, "the request names no process: set process.pid or process.tag")
}

// processList lists the running processes (envd forgets exited ones).
func (s *Server) processList(ctx context.Context, c *call) (response, error) {
	cl, err := s.agent(c.sandbox)
	if err != nil {
		return nil, err
	}
	infos, err := cl.Processes(ctx)
	if err != nil {
		return nil, err
	}
	out := listResponse{Processes: []processInfo{}}
	for _, p := range infos {
		if !p.Running {
			continue
		}
		pi := processInfo{PID: uint32(p.PID)}
		if len(p.Cmd) > 0 {
			pi.Config = processConfig{Cmd: p.Cmd[0], Args: p.Cmd[1:]}
		}
		if p.Cwd != "" {
			cwd := p.Cwd
			pi.Config.Cwd = &cwd
		}
		if p.Tag != "" {
			tag := p.Tag
			pi.Tag = &tag
		}
		out.Processes = append(out.Processes, pi)
	}
	return out, nil
}

// processStart starts a process and streams its events until it ends.
// E2B's SDKs always run commands as "/bin/bash -l -c CMD" (and terminals
// as "/bin/bash -i -l"); in a template without bash, /bin/sh runs them.
// Without a cwd, a process starts in the user's home directory when the
// template has one.
// The call's Connect-Timeout-Ms is the process's timeout, as in envd: it
// is killed when the time is up.
func (s *Server) processStart(ctx context.Context, c *call, out *stream) error {
	var req startRequest
	if err := c.decode(&req); err != nil {
		return err
	}
	if req.Process.Cmd == "" {
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "process.cmd is required")
	}
	cl, err := s.agent(c.sandbox)
	if err != nil {
		return err
	}
	user := userOf(c.header)
	cmd := append([]string{req.Process.Cmd}, req.Process.Args...)
	if cmd[0] == "/bin/bash" {
		if _, err := cl.Stat(ctx, "/bin/bash"); errors.Is(err, errdefs.ErrNotFound) {
			cmd[0] = "/bin/sh"
		}
	}
	sr := wire.StartRequest{ExecRequest: wire.ExecRequest{Cmd: cmd, Env: req.Process.Envs, User: user}}
	if req.Process.Cwd != nil && *req.Process.Cwd != "" {
		sr.Cwd = resolvePath(*req.Process.Cwd, user)
	} else if fi, err := cl.Stat(ctx, home(user)); err == nil && fi.Type == wire.FileTypeDir {
		// As in envd, commands start in the home directory, against which
		// relative file paths resolve too.
		sr.Cwd = home(user)
	}
	if ms, err := strconv.ParseInt(c.header.Get("Connect-Timeout-Ms"), 10, 64); err == nil && ms > 0 {
		sr.TimeoutMS = ms
	}
	if req.PTY != nil {
		size := wire.PTYSize{Cols: 80, Rows: 24}
		if req.PTY.Size != nil && req.PTY.Size.Cols > 0 && req.PTY.Size.Rows > 0 {
			size = wire.PTYSize{Cols: uint16(min(req.PTY.Size.Cols, 65535)), Rows: uint16(min(req.PTY.Size.Rows, 65535))}
		}
		sr.PTY = &size
	}
	sr.OpenStdin = req.Stdin != nil && *req.Stdin
	if req.Tag != nil {
		sr.Tag = *req.Tag
	}
	info, err := s.m.StartProcess(ctx, c.sandbox, sr)
	if err != nil {
		return err
	}
	return follow(ctx, cl, info, c.header, out)
}

// processConnect streams the events of a running or kept process: its
// buffered output from the start, then what follows, then its end.
func (s *Server) processConnect(ctx context.Context, c *call, out *stream) error {
	var req selectorRequest
	cl, info, err := s.processFor(ctx, c, &req, &req.Process)
	if err != nil {
		return err
	}
	return follow(ctx, cl, info, c.header, out)
}

// follow sends a start event, then the process's output and end event
// from the agent's buffer, with keepalives while it is quiet. It returns
// when the process ended and all was sent, or when ctx ends (the client
// left or its timeout passed); the process runs on either way.
func follow(ctx context.Context, cl *agent.Client, info wire.ProcessInfo, h http.Header, out *stream) error {
	if err := out.send(processEventResponse{Event: processEvent{Start: &startEvent{PID: uint32(info.PID)}}}); err != nil {
		return err
	}
	stop := out.keepalive(keepaliveInterval(h), processEventResponse{Event: processEvent{Keepalive: &empty{}}})
	defer stop()
	return cl.ProcessOutput(ctx, info.PID, 0, true, func(ev wire.ExecEvent) error {
		switch ev.Type {
		case wire.EventStdout, wire.EventStderr:
			data := ev.Bytes()
			if len(data) == 0 {
				return nil
			}
			var d dataEvent
			switch {
			case info.PTY:
				d.PTY = data
			case ev.Type == wire.EventStdout:
				d.Stdout = data
			default:
				d.Stderr = data
			}
			return out.send(processEventResponse{Event: processEvent{Data: &d}})
		case wire.EventExit:
			end := endOf(ev)
			return out.send(processEventResponse{Event: processEvent{End: &end}})
		}
		return nil
	})
}

// endOf describes an exit the way envd does from Go's os.ProcessState: a
// process killed by a signal has exit code -1, exited false and a status
// "signal: killed"; a non-zero exit has status and error "exit status N".
func endOf(ev wire.ExecEvent) endEvent {
	if ev.Signal != "" {
		status := "signal: " + strings.ToLower(strings.TrimPrefix(ev.Signal, "SIG"))
		if n := unix.SignalNum(ev.Signal); n != 0 {
			status = "signal: " + syscall.Signal(n).String()
		}
		msg := status
		if ev.TimedOut {
			msg += " (the command's timeout passed)"
		}
		return endEvent{ExitCode: -1, Status: status, Error: &msg}
	}
	code := 0
	if ev.ExitCode != nil {
		code = *ev.ExitCode
	}
	end := endEvent{ExitCode: int32(code), Exited: true, Status: "exit status " + strconv.Itoa(code)}
	if code != 0 {
		msg := end.Status
		end.Error = &msg
	}
	return end
}

func (s *Server) processUpdate(ctx context.Context, c *call) (response, error) {
	var req updateRequest
	cl, info, err := s.processFor(ctx, c, &req, &req.Process)
	if err != nil {
		return nil, err
	}
	if req.PTY != nil && req.PTY.Size != nil {
		size := wire.PTYSize{Cols: uint16(min(req.PTY.Size.Cols, 65535)), Rows: uint16(min(req.PTY.Size.Rows, 65535))}
		if err := cl.Resize(ctx, info.PID, size); err != nil {
			return nil, err
		}
	}
	return empty{}, nil
}

func (s *Server) processSendInput(ctx context.Context, c *call) (response, error) {
	var req sendInputRequest
	cl, info, err := s.processFor(ctx, c, &req, &req.Process)
	if err != nil {
		return nil, err
	}
	if err := cl.WriteStdin(ctx, info.PID, bytes.NewReader(req.Input.data())); err != nil {
		return nil, err
	}
	return empty{}, nil
}

// processStreamInput copies a client stream of input events to the
// process's stdin: a start event naming the process, then data events,
// until the client ends its stream.
func (s *Server) processStreamInput(ctx context.Context, c *call, next func(request) (bool, error)) (response, error) {
	var first streamInputRequest
	ok, err := next(&first)
	if err != nil {
		return nil, err
	}
	if !ok || first.Start == nil {
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "StreamInput must begin with a start event naming the process")
	}
	cl, err := s.agent(c.sandbox)
	if err != nil {
		return nil, err
	}
	info, err := pidOf(ctx, cl, first.Start.Process)
	if err != nil {
		return nil, err
	}
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() { done <- cl.WriteStdin(ctx, info.PID, pr) }()
	var readErr error
	for {
		var msg streamInputRequest
		ok, err := next(&msg)
		if err != nil || !ok {
			readErr = err
			break
		}
		if msg.Data == nil {
			continue
		}
		if _, err := pw.Write(msg.Data.Input.data()); err != nil {
			break // the copy ended; its error comes from done
		}
	}
	pw.CloseWithError(readErr)
	if err := <-done; err != nil {
		return nil, err
	}
	if readErr != nil {
		return nil, readErr
	}
	return empty{}, nil
}

func (s *Server) processSendSignal(ctx context.Context, c *call) (response, error) {
	var req sendSignalRequest
	if err := c.decode(&req); err != nil {
		return nil, err
	}
	var sig string
	switch req.Signal {
	case 9:
		sig = "SIGKILL"
	case 15:
		sig = "SIGTERM"
	default:
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "unsupported signal %d: E2B's API names SIGTERM (15) and SIGKILL (9)", req.Signal)
	}
	cl, err := s.agent(c.sandbox)
	if err != nil {
		return nil, err
	}
	info, err := pidOf(ctx, cl, req.Process)
	if err != nil {
		return nil, err
	}
	if !info.Running {
		return nil, errdefs.Errorf(errdefs.ErrNotFound, "process %d is not running", info.PID)
	}
	if err := cl.Signal(ctx, info.PID, sig); err != nil {
		return nil, err
	}
	return empty{}, nil
}

func (s *Server) processCloseStdin(ctx context.Context, c *call) (response, error) {
	var req selectorRequest
	cl, info, err := s.processFor(ctx, c, &req, &req.Process)
	if err != nil {
		return nil, err
	}
	if err := cl.CloseStdin(ctx, info.PID); err != nil {
		return nil, err
	}
	return empty{}, nil
}
