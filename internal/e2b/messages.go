package e2b

import (
	"encoding/json"
	"time"
)

// This file declares the messages of E2B's process.Process and
// filesystem.Filesystem services that Corral reads (requests) or writes
// (responses). Each names its proto message; the `pb` tags carry the
// field numbers and the `json` tags the JSON names (protobuf.go says how
// the Go types map to protobuf types).

// request is a pointer to a message Corral reads, with parseProto or
// decodeJSON.
type request = any

// response is a message Corral writes, with appendProto or encoding/json.
type response = any

// empty is every response without fields (the *Response of SendInput,
// SendSignal, CloseStdin, Update, Remove, StreamInput and RemoveWatcher,
// and the KeepAlive and StartEvent oneof members). ListRequest, also
// empty, is never read.
type empty struct{}

// processSelector is process.ProcessSelector.
type processSelector struct {
	PID *jsonUint32 `json:"pid" pb:"1,oneof"`
	Tag *string     `json:"tag" pb:"2,oneof"`
}

// processConfig is process.ProcessConfig.
type processConfig struct {
	Cmd  string            `json:"cmd,omitempty" pb:"1"`
	Args []string          `json:"args,omitempty" pb:"2"`
	Envs map[string]string `json:"envs,omitempty" pb:"3"`
	Cwd  *string           `json:"cwd,omitempty" pb:"4"`
}

// ptyConfig is process.PTY.
type ptyConfig struct {
	Size *ptySize `json:"size" pb:"1"`
}

// ptySize is process.PTY.Size.
type ptySize struct {
	Cols jsonUint32 `json:"cols" pb:"1"`
	Rows jsonUint32 `json:"rows" pb:"2"`
}

// startRequest is process.StartRequest.
type startRequest struct {
	Process processConfig `json:"process" pb:"1"`
	PTY     *ptyConfig    `json:"pty" pb:"2"`
	Tag     *string       `json:"tag" pb:"3"`
	Stdin   *bool         `json:"stdin" pb:"4"`
}

// selectorRequest is every request whose first field is the process
// selector: ConnectRequest and CloseStdinRequest, and
// StreamInputRequest.StartEvent.
type selectorRequest struct {
	Process processSelector `json:"process" pb:"1"`
}

// updateRequest is process.UpdateRequest.
type updateRequest struct {
	Process processSelector `json:"process" pb:"1"`
	PTY     *ptyConfig      `json:"pty" pb:"2"`
}

// processInput is process.ProcessInput.
type processInput struct {
	Stdin *jsonBytes `json:"stdin" pb:"1,oneof"`
	PTY   *jsonBytes `json:"pty" pb:"2,oneof"`
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

// sendInputRequest is process.SendInputRequest.
type sendInputRequest struct {
	Process processSelector `json:"process" pb:"1"`
	Input   processInput    `json:"input" pb:"2"`
}

// streamInputRequest is process.StreamInputRequest; Data is its
// DataEvent.
type streamInputRequest struct {
	Start *selectorRequest `json:"start" pb:"1,oneof"`
	Data  *struct {
		Input processInput `json:"input" pb:"2"`
	} `json:"data" pb:"2,oneof"`
	Keepalive *empty `json:"keepalive" pb:"3,oneof"`
}

// signalNumber is the process.Signal enum: SIGNAL_UNSPECIFIED = 0,
// SIGNAL_SIGTERM = 15, SIGNAL_SIGKILL = 9.
type signalNumber int32

func (s *signalNumber) UnmarshalJSON(b []byte) error {
	v, err := enumValue(b, map[string]int32{"SIGNAL_UNSPECIFIED": 0, "SIGNAL_SIGTERM": 15, "SIGNAL_SIGKILL": 9})
	*s = signalNumber(v)
	return err
}

// sendSignalRequest is process.SendSignalRequest.
type sendSignalRequest struct {
	Process processSelector `json:"process" pb:"1"`
	Signal  signalNumber    `json:"signal" pb:"2"`
}

// processInfo is process.ProcessInfo.
type processInfo struct {
	Config processConfig `json:"config" pb:"1"`
	PID    uint32        `json:"pid,omitempty" pb:"2"`
	Tag    *string       `json:"tag,omitempty" pb:"3"`
}

// listResponse is process.ListResponse.
type listResponse struct {
	Processes []processInfo `json:"processes" pb:"1"`
}

// processEvent is process.ProcessEvent.
type processEvent struct {
	Start     *startEvent `json:"start,omitempty" pb:"1,oneof"`
	Data      *dataEvent  `json:"data,omitempty" pb:"2,oneof"`
	End       *endEvent   `json:"end,omitempty" pb:"3,oneof"`
	Keepalive *empty      `json:"keepalive,omitempty" pb:"4,oneof"`
}

// startEvent is process.ProcessEvent.StartEvent.
type startEvent struct {
	PID uint32 `json:"pid,omitempty" pb:"1"`
}

// dataEvent is process.ProcessEvent.DataEvent; it carries one chunk, in
// exactly one field.
type dataEvent struct {
	Stdout []byte `json:"stdout,omitempty" pb:"1,oneof"`
	Stderr []byte `json:"stderr,omitempty" pb:"2,oneof"`
	PTY    []byte `json:"pty,omitempty" pb:"3,oneof"`
}

// endEvent is process.ProcessEvent.EndEvent.
type endEvent struct {
	ExitCode int32   `json:"exitCode,omitempty" pb:"1,zigzag"`
	Exited   bool    `json:"exited,omitempty" pb:"2"`
	Status   string  `json:"status,omitempty" pb:"3"`
	Error    *string `json:"error,omitempty" pb:"4"`
}

// processEventResponse is process.StartResponse and
// process.ConnectResponse.
type processEventResponse struct {
	Event processEvent `json:"event" pb:"1"`
}

// pathRequest is filesystem.StatRequest, MakeDirRequest and
// RemoveRequest.
type pathRequest struct {
	Path string `json:"path" pb:"1"`
}

// moveRequest is filesystem.MoveRequest.
type moveRequest struct {
	Source      string `json:"source" pb:"1"`
	Destination string `json:"destination" pb:"2"`
}

// listDirRequest is filesystem.ListDirRequest.
type listDirRequest struct {
	Path  string     `json:"path" pb:"1"`
	Depth jsonUint32 `json:"depth" pb:"2"`
}

// watchRequest is filesystem.WatchDirRequest and CreateWatcherRequest.
type watchRequest struct {
	Path               string `json:"path" pb:"1"`
	Recursive          bool   `json:"recursive" pb:"2"`
	IncludeEntry       bool   `json:"includeEntry" pb:"3"`
	AllowNetworkMounts bool   `json:"allowNetworkMounts" pb:"4"`
}

// watcherRequest is filesystem.GetWatcherEventsRequest and
// RemoveWatcherRequest.
type watcherRequest struct {
	WatcherID string `json:"watcherId" pb:"1"`
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

// timestamp is a google.protobuf.Timestamp.
type timestamp struct {
	Seconds int64 `pb:"1"`
	Nanos   int32 `pb:"2"`
}

func timestampOf(t time.Time) *timestamp {
	return &timestamp{Seconds: t.Unix(), Nanos: int32(t.Nanosecond())}
}

// MarshalJSON writes RFC 3339 in UTC with 0 or 9 fractional digits: the
// JSON mapping allows 0, 3, 6 or 9, and some parsers accept no other count.
func (ts timestamp) MarshalJSON() ([]byte, error) {
	layout := "2006-01-02T15:04:05Z"
	if ts.Nanos != 0 {
		layout = "2006-01-02T15:04:05.000000000Z"
	}
	return json.Marshal(time.Unix(ts.Seconds, int64(ts.Nanos)).UTC().Format(layout))
}

// entryInfo is filesystem.EntryInfo. Its map metadata = 11 is never set:
// Corral keeps no file metadata.
type entryInfo struct {
	Name          string     `json:"name,omitempty" pb:"1"`
	Type          fileType   `json:"type,omitempty" pb:"2"`
	Path          string     `json:"path,omitempty" pb:"3"`
	Size          int64      `json:"size,omitempty,string" pb:"4"`
	Mode          uint32     `json:"mode,omitempty" pb:"5"`
	Permissions   string     `json:"permissions,omitempty" pb:"6"`
	Owner         string     `json:"owner,omitempty" pb:"7"`
	Group         string     `json:"group,omitempty" pb:"8"`
	ModifiedTime  *timestamp `json:"modifiedTime,omitempty" pb:"9"`
	SymlinkTarget *string    `json:"symlinkTarget,omitempty" pb:"10"`
}

// entryResponse is filesystem.StatResponse, MakeDirResponse and
// MoveResponse.
type entryResponse struct {
	Entry entryInfo `json:"entry" pb:"1"`
}

// listDirResponse is filesystem.ListDirResponse.
type listDirResponse struct {
	Entries []entryInfo `json:"entries" pb:"1"`
}

// fsEvent is filesystem.FilesystemEvent; Name is relative to the watched
// directory.
type fsEvent struct {
	Name  string     `json:"name,omitempty" pb:"1"`
	Type  eventType  `json:"type,omitempty" pb:"2"`
	Entry *entryInfo `json:"entry,omitempty" pb:"3"`
}

// watchDirResponse is filesystem.WatchDirResponse.
type watchDirResponse struct {
	Start      *empty   `json:"start,omitempty" pb:"1,oneof"`
	Filesystem *fsEvent `json:"filesystem,omitempty" pb:"2,oneof"`
	Keepalive  *empty   `json:"keepalive,omitempty" pb:"3,oneof"`
}

// createWatcherResponse is filesystem.CreateWatcherResponse.
type createWatcherResponse struct {
	WatcherID string `json:"watcherId" pb:"1"`
}

// watcherEventsResponse is filesystem.GetWatcherEventsResponse.
type watcherEventsResponse struct {
	Events []fsEvent `json:"events" pb:"1"`
}
