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

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	"github.com/corralrun/corral/internal/agentclient"
	"github.com/corralrun/corral/internal/e2b/envdpb"
	"github.com/corralrun/corral/internal/e2b/envdpb/envdpbconnect"
	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/server"
	"github.com/corralrun/corral/internal/wire"
)

// This file serves E2B's process.Process service on the agent's process
// API. E2B process IDs are the agent's PIDs. Processes keep running when a
// stream ends (as in envd); Connect replays the output the agent still
// buffers, then follows it.

// processService implements process.Process for a Server.
type processService struct{ s *Server }

var _ envdpbconnect.ProcessHandler = processService{}

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
func pidOf(ctx context.Context, cl *agentclient.Client, sel *envdpb.ProcessSelector) (wire.ProcessInfo, error) {
	switch v := sel.GetSelector().(type) {
	case *envdpb.ProcessSelector_Pid:
		return cl.Process(ctx, int(v.Pid))
	case *envdpb.ProcessSelector_Tag:
		infos, err := cl.Processes(ctx)
		if err != nil {
			return wire.ProcessInfo{}, err
		}
		for i := len(infos) - 1; i >= 0; i-- {
			if infos[i].Tag == v.Tag && infos[i].Running {
				return infos[i], nil
			}
		}
		return wire.ProcessInfo{}, errdefs.Errorf(errdefs.ErrNotFound, "no running process has tag %q", v.Tag)
	}
	return wire.ProcessInfo{}, errdefs.Errorf(errdefs.ErrInvalidArgument, "the request names no process: set process.pid or process.tag")
}

// processOf returns the agent of the call's sandbox and the process sel
// names in it.
func (s *Server) processOf(ctx context.Context, sel *envdpb.ProcessSelector) (*agentclient.Client, wire.ProcessInfo, error) {
	cl, err := s.agent(callOf(ctx).sandbox)
	if err != nil {
		return nil, wire.ProcessInfo{}, err
	}
	info, err := pidOf(ctx, cl, sel)
	return cl, info, err
}

// List lists the running processes (envd forgets exited ones).
func (p processService) List(ctx context.Context, _ *connect.Request[envdpb.ListRequest]) (*connect.Response[envdpb.ListResponse], error) {
	cl, err := p.s.agent(callOf(ctx).sandbox)
	if err != nil {
		return nil, err
	}
	infos, err := cl.Processes(ctx)
	if err != nil {
		return nil, err
	}
	out := &envdpb.ListResponse{}
	for _, info := range infos {
		if !info.Running {
			continue
		}
		pi := &envdpb.ProcessInfo{Pid: uint32(info.PID), Config: &envdpb.ProcessConfig{}}
		if len(info.Cmd) > 0 {
			pi.Config = &envdpb.ProcessConfig{Cmd: info.Cmd[0], Args: info.Cmd[1:]}
		}
		if info.Cwd != "" {
			pi.Config.Cwd = proto.String(info.Cwd)
		}
		if info.Tag != "" {
			pi.Tag = proto.String(info.Tag)
		}
		out.Processes = append(out.Processes, pi)
	}
	return connect.NewResponse(out), nil
}

// Start starts a process and streams its events until it ends.
// E2B's SDKs always run commands as "/bin/bash -l -c CMD" (and terminals
// as "/bin/bash -i -l"); in a template without bash, /bin/sh runs them.
// Without a cwd, a process starts in the template's working directory
// (WORKDIR, setWorkdir) if it names one, else in the user's home
// directory when the template has one.
// The call's Connect-Timeout-Ms is the process's timeout, as in envd: it
// is killed when the time is up.
func (p processService) Start(ctx context.Context, req *connect.Request[envdpb.StartRequest], stream *connect.ServerStream[envdpb.StartResponse]) error {
	msg, id := req.Msg, callOf(ctx).sandbox
	if msg.GetProcess().GetCmd() == "" {
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "process.cmd is required")
	}
	cl, err := p.s.agent(id)
	if err != nil {
		return err
	}
	sr, err := startRequest(ctx, cl, msg, req.Header(), p.s.templateWorkdir(id))
	if err != nil {
		return err
	}
	info, err := p.s.m.StartProcess(ctx, id, sr)
	if err != nil {
		return err
	}
	out := &sender[*envdpb.ProcessEvent]{send: func(ev *envdpb.ProcessEvent) error {
		return stream.Send(&envdpb.StartResponse{Event: ev})
	}}
	return follow(ctx, cl, info, req.Header(), out)
}

// startRequest is the agent's request for the envd request msg.
func startRequest(ctx context.Context, cl *agentclient.Client, msg *envdpb.StartRequest, h http.Header, workdir bool) (wire.StartRequest, error) {
	user := userOf(h)
	cmd := append([]string{msg.GetProcess().GetCmd()}, msg.GetProcess().GetArgs()...)
	if cmd[0] == "/bin/bash" {
		if _, err := cl.Stat(ctx, "/bin/bash"); errors.Is(err, errdefs.ErrNotFound) {
			cmd[0] = "/bin/sh"
		}
	}
	sr := wire.StartRequest{ExecRequest: wire.ExecRequest{Cmd: cmd, Env: msg.GetProcess().GetEnvs(), User: user}}
	if cwd := msg.GetProcess().GetCwd(); cwd != "" {
		sr.Cwd = resolvePath(cwd, user)
	} else if workdir {
		// The template's working directory (setWorkdir), which the
		// Manager applies to a request without one.
	} else if fi, err := cl.Stat(ctx, home(user)); err == nil && fi.Type == wire.FileTypeDir {
		// As in envd, commands start in the home directory, against which
		// relative file paths resolve too.
		sr.Cwd = home(user)
	}
	if ms, err := strconv.ParseInt(h.Get("Connect-Timeout-Ms"), 10, 64); err == nil && ms > 0 {
		sr.TimeoutMS = ms
	}
	if msg.Pty != nil {
		size := wire.PTYSize{Cols: 80, Rows: 24}
		if s := msg.Pty.GetSize(); s.GetCols() > 0 && s.GetRows() > 0 {
			size = ptySize(s)
		}
		sr.PTY = &size
	}
	sr.OpenStdin = msg.GetStdin()
	sr.Tag = msg.GetTag()
	return sr, nil
}

func ptySize(s *envdpb.PTY_Size) wire.PTYSize {
	return wire.PTYSize{Cols: uint16(min(s.GetCols(), 65535)), Rows: uint16(min(s.GetRows(), 65535))}
}

// Connect streams the events of a running or kept process: its buffered
// output from the start, then what follows, then its end.
func (p processService) Connect(ctx context.Context, req *connect.Request[envdpb.ConnectRequest], stream *connect.ServerStream[envdpb.ConnectResponse]) error {
	cl, info, err := p.s.processOf(ctx, req.Msg.GetProcess())
	if err != nil {
		return err
	}
	out := &sender[*envdpb.ProcessEvent]{send: func(ev *envdpb.ProcessEvent) error {
		return stream.Send(&envdpb.ConnectResponse{Event: ev})
	}}
	return follow(ctx, cl, info, req.Header(), out)
}

// follow sends a start event, then the process's output and end event
// from the agent's buffer, with keepalives while it is quiet. It returns
// when the process ended and all was sent, or when ctx ends (the client
// left or its timeout passed); the process runs on either way.
func follow(ctx context.Context, cl *agentclient.Client, info wire.ProcessInfo, h http.Header, out *sender[*envdpb.ProcessEvent]) error {
	start := &envdpb.ProcessEvent_StartEvent{Pid: uint32(info.PID)}
	if err := out.Send(&envdpb.ProcessEvent{Event: &envdpb.ProcessEvent_Start{Start: start}}); err != nil {
		return err
	}
	keepalive := &envdpb.ProcessEvent{Event: &envdpb.ProcessEvent_Keepalive{Keepalive: &envdpb.ProcessEvent_KeepAlive{}}}
	stop := out.keepalive(keepaliveInterval(h), keepalive)
	defer stop()
	return cl.ProcessOutput(ctx, info.PID, 0, true, func(ev wire.ExecEvent) error {
		switch ev.Type {
		case wire.EventStdout, wire.EventStderr:
			data := ev.Bytes()
			if len(data) == 0 {
				return nil
			}
			d := &envdpb.ProcessEvent_DataEvent{}
			switch {
			case info.PTY:
				d.Output = &envdpb.ProcessEvent_DataEvent_Pty{Pty: data}
			case ev.Type == wire.EventStdout:
				d.Output = &envdpb.ProcessEvent_DataEvent_Stdout{Stdout: data}
			default:
				d.Output = &envdpb.ProcessEvent_DataEvent_Stderr{Stderr: data}
			}
			return out.Send(&envdpb.ProcessEvent{Event: &envdpb.ProcessEvent_Data{Data: d}})
		case wire.EventExit:
			return out.Send(&envdpb.ProcessEvent{Event: &envdpb.ProcessEvent_End{End: endOf(ev)}})
		}
		return nil
	})
}

// endOf describes an exit the way envd does from Go's os.ProcessState: a
// process killed by a signal has exit code -1, exited false and a status
// "signal: killed"; a non-zero exit has status and error "exit status N".
func endOf(ev wire.ExecEvent) *envdpb.ProcessEvent_EndEvent {
	if ev.Signal != "" {
		status := "signal: " + strings.ToLower(strings.TrimPrefix(ev.Signal, "SIG"))
		if n := unix.SignalNum(ev.Signal); n != 0 {
			status = "signal: " + syscall.Signal(n).String()
		}
		msg := status
		if ev.TimedOut {
			msg += " (the command's timeout passed)"
		}
		return &envdpb.ProcessEvent_EndEvent{ExitCode: -1, Status: status, Error: &msg}
	}
	code := 0
	if ev.ExitCode != nil {
		code = *ev.ExitCode
	}
	end := &envdpb.ProcessEvent_EndEvent{ExitCode: int32(code), Exited: true, Status: "exit status " + strconv.Itoa(code)}
	if code != 0 {
		end.Error = proto.String(end.Status)
	}
	return end
}

// Update resizes a process's terminal.
func (p processService) Update(ctx context.Context, req *connect.Request[envdpb.UpdateRequest]) (*connect.Response[envdpb.UpdateResponse], error) {
	cl, info, err := p.s.processOf(ctx, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if size := req.Msg.GetPty().GetSize(); size != nil {
		if err := cl.Resize(ctx, info.PID, ptySize(size)); err != nil {
			return nil, err
		}
	}
	return connect.NewResponse(&envdpb.UpdateResponse{}), nil
}

// inputOf returns the bytes of in, whichever member carries them.
func inputOf(in *envdpb.ProcessInput) []byte {
	if b := in.GetStdin(); b != nil {
		return b
	}
	return in.GetPty()
}

// SendInput writes to a process's standard input or terminal.
func (p processService) SendInput(ctx context.Context, req *connect.Request[envdpb.SendInputRequest]) (*connect.Response[envdpb.SendInputResponse], error) {
	cl, info, err := p.s.processOf(ctx, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if err := cl.WriteStdin(ctx, info.PID, bytes.NewReader(inputOf(req.Msg.GetInput()))); err != nil {
		return nil, err
	}
	return connect.NewResponse(&envdpb.SendInputResponse{}), nil
}

// StreamInput copies a client stream of input events to the process's
// stdin: a start event naming the process, then data events, until the
// client ends its stream.
func (p processService) StreamInput(ctx context.Context, in *connect.ClientStream[envdpb.StreamInputRequest]) (*connect.Response[envdpb.StreamInputResponse], error) {
	if !in.Receive() {
		if err := in.Err(); err != nil {
			return nil, err
		}
	}
	start := in.Msg().GetStart()
	if start == nil {
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "StreamInput must begin with a start event naming the process")
	}
	cl, info, err := p.s.processOf(ctx, start.GetProcess())
	if err != nil {
		return nil, err
	}
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() { done <- cl.WriteStdin(ctx, info.PID, pr) }()
	for in.Receive() {
		data := in.Msg().GetData()
		if data == nil {
			continue
		}
		if _, err := pw.Write(inputOf(data.GetInput())); err != nil {
			break // the copy ended; its error comes from done
		}
	}
	readErr := in.Err()
	pw.CloseWithError(readErr)
	if err := <-done; err != nil {
		return nil, err
	}
	if readErr != nil {
		return nil, readErr
	}
	return connect.NewResponse(&envdpb.StreamInputResponse{}), nil
}

// SendSignal sends SIGTERM or SIGKILL to a running process.
func (p processService) SendSignal(ctx context.Context, req *connect.Request[envdpb.SendSignalRequest]) (*connect.Response[envdpb.SendSignalResponse], error) {
	var sig string
	switch n := req.Msg.GetSignal(); n {
	case envdpb.Signal_SIGNAL_SIGKILL:
		sig = "SIGKILL"
	case envdpb.Signal_SIGNAL_SIGTERM:
		sig = "SIGTERM"
	default:
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "unsupported signal %d: E2B's API names SIGTERM (15) and SIGKILL (9)", int32(n))
	}
	cl, info, err := p.s.processOf(ctx, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if !info.Running {
		return nil, errdefs.Errorf(errdefs.ErrNotFound, "process %d is not running", info.PID)
	}
	if err := cl.Signal(ctx, info.PID, sig); err != nil {
		return nil, err
	}
	return connect.NewResponse(&envdpb.SendSignalResponse{}), nil
}

// CloseStdin closes a process's standard input.
func (p processService) CloseStdin(ctx context.Context, req *connect.Request[envdpb.CloseStdinRequest]) (*connect.Response[envdpb.CloseStdinResponse], error) {
	cl, info, err := p.s.processOf(ctx, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if err := cl.CloseStdin(ctx, info.PID); err != nil {
		return nil, err
	}
	return connect.NewResponse(&envdpb.CloseStdinResponse{}), nil
}

// templateWorkdir reports whether sandbox id's template names a working
// directory.
func (s *Server) templateWorkdir(id string) bool {
	sb, err := s.m.Get(context.Background(), id)
	if err != nil {
		return false
	}
	t, err := s.m.Template(context.Background(), sb.Template)
	return err == nil && t.Defaults != nil && t.Defaults.WorkingDir != ""
}
