package e2b

import "encoding/json"

// This file declares the messages of E2B's process.Process and
// filesystem.Filesystem services that Corral reads (requests: parseProto
// and JSON decoding) or writes (responses: appendProto and JSON encoding).
// Each comment names the proto message and its fields with their numbers.

// request is a message Corral reads.
type request interface {
	// parseProto reads the binary encoding; unknown fields are skipped.
	parseProto(b []byte) error
}

// response is a message Corral writes.
type response interface {
	// appendProto appends the binary encoding to b.
	appendProto(b []byte) []byte
}

// empty is every response without fields (the *Response of SendInput,
// SendSignal, CloseStdin, Update, Remove, StreamInput and RemoveWatcher,
// and the KeepAlive and StartEvent oneof members). ListRequest, also
// empty, is never read.
type empty struct{}

func (empty) appendProto(b []byte) []byte { return b }

// processSelector is process.ProcessSelector: oneof pid = 1 (uint32),
// tag = 2 (string).
type processSelector struct {
	PID *jsonUint32 `json:"pid"`
	Tag *string     `json:"tag"`
}

func (s *processSelector) parseProto(b []byte) error {
	return parseFields(b, func(f pbField) error {
		switch f.num {
		case 1:
			v := jsonUint32(f.v)
			s.PID = &v
		case 2:
			v := string(f.b)
			s.Tag = &v
		}
		return nil
	})
}

// processConfig is process.ProcessConfig: cmd = 1, repeated args = 2,
// map envs = 3, optional cwd = 4.
type processConfig struct {
	Cmd  string            `json:"cmd,omitempty"`
	Args []string          `json:"args,omitempty"`
	Envs map[string]string `json:"envs,omitempty"`
	Cwd  *string           `json:"cwd,omitempty"`
}

func (c processConfig) appendProto(b []byte) []byte {
	e := pbEnc(b)
	e.str(1, c.Cmd)
	for _, a := range c.Args {
		e.strAlways(2, a)
	}
	e.stringMap(3, c.Envs)
	e.optStr(4, c.Cwd)
	return e
}

func (c *processConfig) parseProto(b []byte) error {
	return parseFields(b, func(f pbField) error {
		switch f.num {
		case 1:
			c.Cmd = string(f.b)
		case 2:
			c.Args = append(c.Args, string(f.b))
		case 3:
			if c.Envs == nil {
				c.Envs = map[string]string{}
			}
			return parseStringMapEntry(f, c.Envs)
		case 4:
			v := string(f.b)
			c.Cwd = &v
		}
		return nil
	})
}

// ptyConfig is process.PTY: size = 1, a PTY.Size with cols = 1 and
// rows = 2 (uint32).
type ptyConfig struct {
	Size *ptySize `json:"size"`
}

type ptySize struct {
	Cols jsonUint32 `json:"cols"`
	Rows jsonUint32 `json:"rows"`
}

func (p *ptyConfig) parseProto(b []byte) error {
	return parseFields(b, func(f pbField) error {
		if f.num != 1 {
			return nil
		}
		p.Size = &ptySize{}
		return parseFields(f.b, func(g pbField) error {
			switch g.num {
			case 1:
				p.Size.Cols = jsonUint32(g.v)
			case 2:
				p.Size.Rows = jsonUint32(g.v)
			}
			return nil
		})
	})
}

// startRequest is process.StartRequest: process = 1, optional pty = 2,
// optional tag = 3, optional stdin = 4 (bool).
type startRequest struct {
	Process processConfig `json:"process"`
	PTY     *ptyConfig    `json:"pty"`
	Tag     *string       `json:"tag"`
	Stdin   *bool         `json:"stdin"`
}

func (r *startRequest) parseProto(b []byte) error {
	return parseFields(b, func(f pbField) error {
		switch f.num {
		case 1:
			return parseMsg(f, &r.Process)
		case 2:
			r.PTY = &ptyConfig{}
			return parseMsg(f, r.PTY)
		case 3:
			v := string(f.b)
			r.Tag = &v
		case 4:
			v := f.v != 0
			r.Stdin = &v
		}
		return nil
	})
}

// selectorRequest is every request whose first field is the process
// selector: ConnectRequest and CloseStdinRequest (process = 1), and the
// process part of UpdateRequest, SendInputRequest and SendSignalRequest.
type selectorRequest struct {
	Process processSelector `json:"process"`
}

func (r *selectorRequest) parseProto(b []byte) error {
	return parseFields(b, func(f pbField) error {
		if f.num == 1 {
			return parseMsg(f, &r.Process)
		}
		return nil
	})
}

// updateRequest is process.UpdateRequest: process = 1, optional pty = 2.
type updateRequest struct {
	Process processSelector `json:"process"`
	PTY     *ptyConfig      `json:"pty"`
}

func (r *updateRequest) parseProto(b []byte) error {
	return parseFields(b, func(f pbField) error {
		switch f.num {
		case 1:
			return parseMsg(f, &r.Process)
		case 2:
			r.PTY = &ptyConfig{}
			return parseMsg(f, r.PTY)
		}
		return nil
	})
}

// processInput is process.ProcessInput: oneof stdin = 1, pty = 2 (bytes).
type processInput struct {
	Stdin *jsonBytes `json:"stdin"`
	PTY   *jsonBytes `json:"pty"`
}

func (in *processInput) parseProto(b []byte) error {
	return parseFields(b, func(f pbField) error {
		v := jsonBytes(append([]byte{}, f.b...))
		switch f.num {
		case 1:
			in.Stdin = &v
		case 2:
			in.PTY = &v
		}
		return nil
	})
}

// data returns the input's bytes, whichever member carries them.
func (in processInput) data() []byte {
	if in.Stdin != nil {
		return *in.Stdin
	}
	if in.PTY != nil {
		return *in.PTY
	}
	return nil
}

// sendInputRequest is process.SendInputRequest: process = 1, input = 2.
type sendInputRequest struct {
	Process processSelector `json:"process"`
	Input   processInput    `json:"input"`
}

func (r *sendInputRequest) parseProto(b []byte) error {
	return parseFields(b, func(f pbField) error {
		switch f.num {
		case 1:
			return parseMsg(f, &r.Process)
		case 2:
			return parseMsg(f, &r.Input)
		}
		return nil
	})
}

// streamInputRequest is process.StreamInputRequest: oneof start = 1
// (StartEvent: process = 1), data = 2 (DataEvent: input = 2),
// keepalive = 3.
type streamInputRequest struct {
	Start *selectorRequest `json:"start"`
	Data  *struct {
		Input processInput `json:"input"`
	} `json:"data"`
	Keepalive *empty `json:"keepalive"`
}

func (r *streamInputRequest) parseProto(b []byte) error {
	return parseFields(b, func(f pbField) error {
		switch f.num {
		case 1:
			r.Start = &selectorRequest{}
			return parseMsg(f, r.Start)
		case 2:
			r.Data = &struct {
				Input processInput `json:"input"`
			}{}
			return parseFields(f.b, func(g pbField) error {
				if g.num == 2 {
					return parseMsg(g, &r.Data.Input)
				}
				return nil
			})
		case 3:
			r.Keepalive = &empty{}
		}
		return nil
	})
}

// signalNumber is the process.Signal enum: SIGNAL_UNSPECIFIED = 0,
// SIGNAL_SIGTERM = 15, SIGNAL_SIGKILL = 9.
type signalNumber int32

func (s *signalNumber) UnmarshalJSON(b []byte) error {
	v, err := enumValue(b, map[string]int32{"SIGNAL_UNSPECIFIED": 0, "SIGNAL_SIGTERM": 15, "SIGNAL_SIGKILL": 9})
	*s = signalNumber(v)
	return err
}

// sendSignalRequest is process.SendSignalRequest: process = 1, signal = 2.
type sendSignalRequest struct {
	Process processSelector `json:"process"`
	Signal  signalNumber    `json:"signal"`
}

func (r *sendSignalRequest) parseProto(b []byte) error {
	return parseFields(b, func(f pbField) error {
		switch f.num {
		case 1:
			return parseMsg(f, &r.Process)
		case 2:
			r.Signal = signalNumber(int32(f.v))
		}
		return nil
	})
}

// processInfo is process.ProcessInfo: config = 1, pid = 2, optional
// tag = 3.
type processInfo struct {
	Config processConfig `json:"config"`
	PID    uint32        `json:"pid,omitempty"`
	Tag    *string       `json:"tag,omitempty"`
}

func (p processInfo) appendProto(b []byte) []byte {
	e := pbEnc(b)
	e.msg(1, p.Config)
	e.uvarint(2, uint64(p.PID))
	e.optStr(3, p.Tag)
	return e
}

// listResponse is process.ListResponse: repeated processes = 1.
type listResponse struct {
	Processes []processInfo `json:"processes"`
}

func (r listResponse) appendProto(b []byte) []byte {
	e := pbEnc(b)
	for _, p := range r.Processes {
		e.msg(1, p)
	}
	return e
}

// processEvent is process.ProcessEvent: oneof start = 1 (StartEvent:
// pid = 1), data = 2 (DataEvent: oneof stdout = 1, stderr = 2, pty = 3),
// end = 3 (EndEvent: exit_code = 1 sint32, exited = 2, status = 3,
// optional error = 4), keepalive = 4.
type processEvent struct {
	Start     *startEvent `json:"start,omitempty"`
	Data      *dataEvent  `json:"data,omitempty"`
	End       *endEvent   `json:"end,omitempty"`
	Keepalive *empty      `json:"keepalive,omitempty"`
}

type startEvent struct {
	PID uint32 `json:"pid,omitempty"`
}

func (s startEvent) appendProto(b []byte) []byte {
	e := pbEnc(b)
	e.uvarint(1, uint64(s.PID))
	return e
}

// dataEvent carries one chunk; exactly one field is set.
type dataEvent struct {
	Stdout []byte `json:"stdout,omitempty"`
	Stderr []byte `json:"stderr,omitempty"`
	PTY    []byte `json:"pty,omitempty"`
}

func (d dataEvent) appendProto(b []byte) []byte {
	e := pbEnc(b)
	switch {
	case d.Stdout != nil:
		e.bytesAlways(1, d.Stdout)
	case d.Stderr != nil:
		e.bytesAlways(2, d.Stderr)
	case d.PTY != nil:
		e.bytesAlways(3, d.PTY)
	}
	return e
}

type endEvent struct {
	ExitCode int32   `json:"exitCode,omitempty"`
	Exited   bool    `json:"exited,omitempty"`
	Status   string  `json:"status,omitempty"`
	Error    *string `json:"error,omitempty"`
}

func (d endEvent) appendProto(b []byte) []byte {
	e := pbEnc(b)
	e.sint32(1, d.ExitCode)
	e.bool(2, d.Exited)
	e.str(3, d.Status)
	e.optStr(4, d.Error)
	return e
}

func (p processEvent) appendProto(b []byte) []byte {
	e := pbEnc(b)
	switch {
	case p.Start != nil:
		e.msg(1, *p.Start)
	case p.Data != nil:
		e.msg(2, *p.Data)
	case p.End != nil:
		e.msg(3, *p.End)
	case p.Keepalive != nil:
		e.msg(4, empty{})
	}
	return e
}

// processEventResponse is process.StartResponse and
// process.ConnectResponse: event = 1.
type processEventResponse struct {
	Event processEvent `json:"event"`
}

func (r processEventResponse) appendProto(b []byte) []byte {
	e := pbEnc(b)
	e.msg(1, r.Event)
	return e
}

// pathRequest is filesystem.StatRequest, MakeDirRequest and
// RemoveRequest: path = 1.
type pathRequest struct {
	Path string `json:"path"`
}

func (r *pathRequest) parseProto(b []byte) error {
	return parseFields(b, func(f pbField) error {
		if f.num == 1 {
			r.Path = string(f.b)
		}
		return nil
	})
}

// moveRequest is filesystem.MoveRequest: source = 1, destination = 2.
type moveRequest struct {
	Source      string `json:"source"`
	Destination string `json:"destination"`
}

func (r *moveRequest) parseProto(b []byte) error {
	return parseFields(b, func(f pbField) error {
		switch f.num {
		case 1:
			r.Source = string(f.b)
		case 2:
			r.Destination = string(f.b)
		}
		return nil
	})
}

// listDirRequest is filesystem.ListDirRequest: path = 1, depth = 2.
type listDirRequest struct {
	Path  string     `json:"path"`
	Depth jsonUint32 `json:"depth"`
}

func (r *listDirRequest) parseProto(b []byte) error {
	return parseFields(b, func(f pbField) error {
		switch f.num {
		case 1:
			r.Path = string(f.b)
		case 2:
			r.Depth = jsonUint32(f.v)
		}
		return nil
	})
}

// watchRequest is filesystem.WatchDirRequest and CreateWatcherRequest:
// path = 1, recursive = 2, include_entry = 3, allow_network_mounts = 4.
type watchRequest struct {
	Path               string `json:"path"`
	Recursive          bool   `json:"recursive"`
	IncludeEntry       bool   `json:"includeEntry"`
	AllowNetworkMounts bool   `json:"allowNetworkMounts"`
}

func (r *watchRequest) parseProto(b []byte) error {
	return parseFields(b, func(f pbField) error {
		switch f.num {
		case 1:
			r.Path = string(f.b)
		case 2:
			r.Recursive = f.v != 0
		case 3:
			r.IncludeEntry = f.v != 0
		case 4:
			r.AllowNetworkMounts = f.v != 0
		}
		return nil
	})
}

// watcherRequest is filesystem.GetWatcherEventsRequest and
// RemoveWatcherRequest: watcher_id = 1.
type watcherRequest struct {
	WatcherID string `json:"watcherId"`
}

func (r *watcherRequest) parseProto(b []byte) error {
	return parseFields(b, func(f pbField) error {
		if f.num == 1 {
			r.WatcherID = string(f.b)
		}
		return nil
	})
}

// fileType is the filesystem.FileType enum.
type fileType int32

const (
	fileTypeUnspecified fileType = 0
	fileTypeFile        fileType = 1
	fileTypeDirectory   fileType = 2
	fileTypeSymlink     fileType = 3
)

func (t fileType) MarshalJSON() ([]byte, error) {
	names := [...]string{"FILE_TYPE_UNSPECIFIED", "FILE_TYPE_FILE", "FILE_TYPE_DIRECTORY", "FILE_TYPE_SYMLINK"}
	if t < 0 || int(t) >= len(names) {
		return json.Marshal(int32(t))
	}
	return json.Marshal(names[t])
}

// eventType is the filesystem.EventType enum.
type eventType int32

const (
	eventCreate eventType = 1
	eventWrite  eventType = 2
	eventRemove eventType = 3
	eventRename eventType = 4
	eventChmod  eventType = 5
)

func (t eventType) MarshalJSON() ([]byte, error) {
	names := [...]string{"EVENT_TYPE_UNSPECIFIED", "EVENT_TYPE_CREATE", "EVENT_TYPE_WRITE", "EVENT_TYPE_REMOVE", "EVENT_TYPE_RENAME", "EVENT_TYPE_CHMOD"}
	if t < 0 || int(t) >= len(names) {
		return json.Marshal(int32(t))
	}
	return json.Marshal(names[t])
}

// entryInfo is filesystem.EntryInfo: name = 1, type = 2, path = 3,
// size = 4 (int64), mode = 5 (uint32), permissions = 6, owner = 7,
// group = 8, modified_time = 9 (Timestamp), optional symlink_target = 10,
// map metadata = 11 (never set: Corral keeps no file metadata).
type entryInfo struct {
	Name          string     `json:"name,omitempty"`
	Type          fileType   `json:"type,omitempty"`
	Path          string     `json:"path,omitempty"`
	Size          int64      `json:"size,omitempty,string"`
	Mode          uint32     `json:"mode,omitempty"`
	Permissions   string     `json:"permissions,omitempty"`
	Owner         string     `json:"owner,omitempty"`
	Group         string     `json:"group,omitempty"`
	ModifiedTime  *timestamp `json:"modifiedTime,omitempty"`
	SymlinkTarget *string    `json:"symlinkTarget,omitempty"`
}

func (en entryInfo) appendProto(b []byte) []byte {
	e := pbEnc(b)
	e.str(1, en.Name)
	e.uvarint(2, uint64(en.Type))
	e.str(3, en.Path)
	e.int64(4, en.Size)
	e.uvarint(5, uint64(en.Mode))
	e.str(6, en.Permissions)
	e.str(7, en.Owner)
	e.str(8, en.Group)
	if en.ModifiedTime != nil {
		e.msg(9, *en.ModifiedTime)
	}
	e.optStr(10, en.SymlinkTarget)
	return e
}

// entryResponse is filesystem.StatResponse, MakeDirResponse and
// MoveResponse: entry = 1.
type entryResponse struct {
	Entry entryInfo `json:"entry"`
}

func (r entryResponse) appendProto(b []byte) []byte {
	e := pbEnc(b)
	e.msg(1, r.Entry)
	return e
}

// listDirResponse is filesystem.ListDirResponse: repeated entries = 1.
type listDirResponse struct {
	Entries []entryInfo `json:"entries"`
}

func (r listDirResponse) appendProto(b []byte) []byte {
	e := pbEnc(b)
	for _, en := range r.Entries {
		e.msg(1, en)
	}
	return e
}

// fsEvent is filesystem.FilesystemEvent: name = 1 (relative to the
// watched directory), type = 2, optional entry = 3.
type fsEvent struct {
	Name  string     `json:"name,omitempty"`
	Type  eventType  `json:"type,omitempty"`
	Entry *entryInfo `json:"entry,omitempty"`
}

func (ev fsEvent) appendProto(b []byte) []byte {
	e := pbEnc(b)
	e.str(1, ev.Name)
	e.uvarint(2, uint64(ev.Type))
	if ev.Entry != nil {
		e.msg(3, *ev.Entry)
	}
	return e
}

// watchDirResponse is filesystem.WatchDirResponse: oneof start = 1,
// filesystem = 2, keepalive = 3.
type watchDirResponse struct {
	Start      *empty   `json:"start,omitempty"`
	Filesystem *fsEvent `json:"filesystem,omitempty"`
	Keepalive  *empty   `json:"keepalive,omitempty"`
}

func (r watchDirResponse) appendProto(b []byte) []byte {
	e := pbEnc(b)
	switch {
	case r.Start != nil:
		e.msg(1, empty{})
	case r.Filesystem != nil:
		e.msg(2, *r.Filesystem)
	case r.Keepalive != nil:
		e.msg(3, empty{})
	}
	return e
}

// createWatcherResponse is filesystem.CreateWatcherResponse:
// watcher_id = 1.
type createWatcherResponse struct {
	WatcherID string `json:"watcherId"`
}

func (r createWatcherResponse) appendProto(b []byte) []byte {
	e := pbEnc(b)
	e.str(1, r.WatcherID)
	return e
}

// watcherEventsResponse is filesystem.GetWatcherEventsResponse: repeated
// events = 1.
type watcherEventsResponse struct {
	Events []fsEvent `json:"events"`
}

func (r watcherEventsResponse) appendProto(b []byte) []byte {
	e := pbEnc(b)
	for _, ev := range r.Events {
		e.msg(1, ev)
	}
	return e
}
