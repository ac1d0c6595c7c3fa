// Package agentserver is the in-sandbox agent: the process that runs as PID 1 of
// every sandbox (started as `corral agent`) and serves exec and file
// operations to the daemon. It must not know about drivers, storage or the
// daemon's state; it only sees the sandbox from inside.
//
// # Start-up contract with drivers
//
// The driver starts `/.corral/agent agent --listen-fd=4 --ready-fd=3`:
//   - fd 4 is a listening unix stream socket created by the daemon on the
//     host, so the sandbox never sees or controls the socket's path;
//   - fd 3 is the write end of a pipe; the agent writes "ok\n" to it once it
//     is ready to serve, or one line "error: <message>\n" when start-up
//     fails, and closes it either way.
//
// Where the agent cannot accept connections from the host (gVisor, VMs),
// the driver starts `/.corral/agent agent --dial=PATH` instead: the agent
// dials the unix socket PATH, serves yamux streams over the connection
// (ServeDialing), dials again whenever it breaks, and on SIGHUP drops it
// and dials again at once.
//
// Before it reports ready the agent installs the seccomp program of
// --seccomp, --seccomp-file or --seccomp-env, on all its threads, and
// writes the limits of --limits or --limits-env. With --spawn-thread (gVisor) one locked thread takes the
// filter and writes the limits instead, and starts every process, with
// more such threads when starts come at once (spawner).
//
// As PID 1 the agent brings up the loopback interface and reaps every
// orphaned process in the sandbox.
//
// # Protocol (HTTP/1.1 over the stream connection)
//
//	GET    /health                      -> wire.Health
//	POST   /exec          wire.ExecRequest -> 200, NDJSON stream of wire.ExecEvent
//	GET    /files?path=P                -> raw bytes of the file
//	PUT    /files?path=P&mode=0644      <- raw bytes; creates parents; -> wire.FileInfo
//	DELETE /files?path=P&recursive=true -> 204
//	GET    /files/stat?path=P           -> wire.FileInfo
//	GET    /files/list?path=P           -> []wire.FileInfo sorted by name
//	POST   /files/mkdir  wire.MkdirRequest  -> wire.FileInfo
//	POST   /files/rename wire.RenameRequest -> wire.FileInfo of the new path
//
// Processes that outlive their request:
//
//	POST   /processes               wire.StartRequest -> 201 wire.ProcessInfo
//	GET    /processes               -> []wire.ProcessInfo (running and kept exited ones)
//	GET    /processes/{pid}         -> wire.ProcessInfo
//	GET    /processes/{pid}/output?from=N&follow=true
//	                                -> NDJSON wire.ExecEvent: start (pid, dropped),
//	                                   buffered output from byte N (each chunk with
//	                                   its offset), then live output while follow,
//	                                   then exit once the process has ended
//	POST   /processes/{pid}/stdin   <- raw bytes (may be a long streaming body) -> 204
//	DELETE /processes/{pid}/stdin   close stdin -> 204
//	POST   /processes/{pid}/signal  wire.SignalRequest -> 204 (to the process group)
//	POST   /processes/{pid}/resize  wire.PTYSize -> 204 (PTY processes only)
//	GET    /processes/{pid}/wait    -> wire.ProcessInfo once it exited (blocks)
//
// The sandbox's service, the template's supervised start command:
//
//	POST   /service  wire.ServiceRequest -> 200 wire.ServiceStatus once ready;
//	                                   409 already_exists when started before;
//	                                   409 failed_precondition (exit status and
//	                                   output tail in the message) when it exits
//	                                   or is not ready in time
//	GET    /service                 -> wire.ServiceStatus; 404 when none
//
// The start command runs as a background process tagged "service"; each
// restart is a new process, and the ended ones stay in GET /processes
// like other exited processes. The service keeps running after a failed
// wait.
//
// A sandbox port, for the daemon's port forwarding:
//
//	GET    /connect?port=N  with "Connection: Upgrade", "Upgrade: tcp"
//	                                -> 101, then the connection carries the bytes
//	                                   of a TCP connection to 127.0.0.1:N inside
//	DELETE /processes/{pid}         kill the group if running, forget it -> 204
//
// Each process keeps the last 1 MiB of its output for re-attach; exited
// background processes are kept (the newest 256) until removed. Foreground
// /exec processes appear in GET /processes while they run; their output
// goes only to their exec stream, so /output refuses them.
//
// Output is never held back for a reader: a follower that falls more than
// the buffer behind resumes at the oldest byte still kept, and that
// chunk's Dropped says how many bytes it skipped. Stdin takes one writer
// at a time (the initial Stdin first); a later writer waits its turn.
// Closing a terminal's stdin sends ^D and leaves the terminal open. A PTY
// process without cmd or shell runs the user's login shell from the
// sandbox's /etc/passwd (else /bin/sh) as "-sh"; TERM defaults to
// xterm-256color.
//
// Trees and change notification:
//
//	GET    /files/archive?path=P    -> tar of P (a file, or a directory's contents)
//	PUT    /files/archive?path=P    <- tar, extracted into directory P (created);
//	                                   entries that would land outside P are refused
//	GET    /files/watch?path=P&recursive=true
//	                                -> NDJSON wire.WatchEvent until the client leaves
//	                                   (or P itself goes away)
//
// Uploaded archives are refused when an entry's name is absolute too,
// although it could be placed inside P: in an upload it means a path on
// the client's side.
//
// Paths must be absolute. Errors are wire.ErrorBody with the matching HTTP
// status. An exec that cannot start (no such executable, bad cwd or user)
// fails with an error status before any stream begins. When the client of a
// running exec goes away, the process group is killed.
package agentserver
