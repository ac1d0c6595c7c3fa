package mcp

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	corral "github.com/corralrun/corral/sdk"
)

// CreateIn is the input of sandbox_create.
type CreateIn struct {
	Template     string            `json:"template,omitempty" jsonschema:"template (root filesystem) to start from; default: the operator's"`
	Runtime      string            `json:"runtime,omitempty" jsonschema:"isolation: runc (container) or gvisor (user-space kernel), as the operator allows"`
	FromSnapshot string            `json:"from_snapshot,omitempty" jsonschema:"start from this snapshot instead of a template"`
	CPUs         float64           `json:"cpus,omitempty" jsonschema:"CPU cores (e.g. 0.5 or 2)"`
	MemoryMB     int64             `json:"memory_mb,omitempty" jsonschema:"memory limit in MiB"`
	DiskMB       int64             `json:"disk_mb,omitempty" jsonschema:"disk quota in MiB"`
	Timeout      int               `json:"timeout_seconds,omitempty" jsonschema:"delete the sandbox after this many seconds; default: the daemon's"`
	Env          map[string]string `json:"env,omitempty" jsonschema:"environment variables of every process in the sandbox"`
	Network      *NetworkIn        `json:"network,omitempty" jsonschema:"network access; default: the operator's policy"`
	Volumes      []VolumeIn        `json:"volumes,omitempty" jsonschema:"named volumes to mount"`
}

// NetworkIn is a network policy a client asks for.
type NetworkIn struct {
	Mode         string   `json:"mode,omitempty" jsonschema:"none (no network), allowlist (only the rules below) or open"`
	AllowDomains []string `json:"allow_domains,omitempty" jsonschema:"domains that may be reached, as NAME or NAME:PORT[,PORT]; NAME may start with *."`
	AllowCIDRs   []string `json:"allow_cidrs,omitempty" jsonschema:"IPv4 ranges that may be reached, as ADDRESS[/BITS][:PORT[,PORT]]"`
}

// VolumeIn is a volume a client mounts.
type VolumeIn struct {
	Name     string `json:"name" jsonschema:"the volume's name"`
	Path     string `json:"path" jsonschema:"absolute path in the sandbox"`
	ReadOnly bool   `json:"read_only,omitempty"`
}

func (s *Server) sandboxCreate(ctx context.Context, st *session, in CreateIn) (*mcp.CallToolResult, error) {
	opts := s.createDefaults(st)
	if in.Template != "" {
		opts.Template = in.Template
	}
	if in.Runtime != "" {
		if err := s.checkRuntime(in.Runtime); err != nil {
			return nil, err
		}
		opts.Runtime = in.Runtime
	}
	if in.FromSnapshot != "" {
		opts.FromSnapshot = in.FromSnapshot
		if in.Template == "" {
			opts.Template = ""
		}
		if in.Runtime == "" {
			// The snapshot's runtime, which must be one the policy allows.
			snap, err := st.client.GetSnapshot(ctx, in.FromSnapshot)
			if err != nil {
				return nil, err
			}
			if err := s.checkRuntime(snap.Runtime); err != nil {
				return nil, err
			}
			opts.Runtime = ""
		}
	}
	if in.CPUs < 0 || in.MemoryMB < 0 || in.DiskMB < 0 {
		return nil, invalid("cpus, memory_mb and disk_mb must not be negative")
	}
	opts.CPUs, opts.MemoryMB, opts.DiskMB, opts.Env = in.CPUs, in.MemoryMB, in.DiskMB, in.Env
	if in.Timeout != 0 {
		d, err := seconds("timeout_seconds", in.Timeout, 30*24*3600)
		if err != nil {
			return nil, err
		}
		opts.Timeout = corral.Timeout(d)
	}
	if in.Network != nil {
		n, err := s.network(*in.Network)
		if err != nil {
			return nil, err
		}
		opts.Network = &n
	}
	for _, v := range in.Volumes {
		if v.Name == "" || v.Path == "" {
			return nil, invalid("a volume needs a name and a path")
		}
		m := corral.Mount{Volume: v.Name, Target: v.Path, Mode: corral.MountReadWrite}
		if v.ReadOnly {
			m.Mode = corral.MountReadOnly
		}
		opts.Mounts = append(opts.Mounts, m)
	}
	sb, err := s.create(ctx, st, opts)
	if err != nil {
		return nil, err
	}
	return textResult("created "+describe(sb, "")+"\n", summary(sb, "")), nil
}

// checkRuntime fails unless the policy allows runtime.
func (s *Server) checkRuntime(runtime string) error {
	allowed := s.cfg.Policy.Runtimes
	if len(allowed) == 0 {
		return nil
	}
	for _, r := range allowed {
		if r == runtime {
			return nil
		}
	}
	return &corral.Error{Status: 403, Code: corral.CodePermissionDenied,
		Message: fmt.Sprintf("runtime %q is not allowed here; allowed: %s", runtime, strings.Join(allowed, ", "))}
}

// describe is a one-line description of a sandbox for a model.
func describe(sb *corral.Sandbox, sessionID string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %s, template %s, runtime %s, %g CPU, %d MiB", sb.ID, sb.State, sb.Template, sb.Runtime, sb.CPUs, sb.MemoryMB)
	if sb.Network != nil && sb.Network.Mode != "" {
		fmt.Fprintf(&b, ", network %s", sb.Network.Mode)
	}
	if sb.Deadline != nil {
		fmt.Fprintf(&b, ", deadline in %s", time.Until(*sb.Deadline).Round(time.Second))
	}
	if sb.ID == sessionID {
		b.WriteString(" (session: this session's own sandbox)")
	}
	if sb.Error != "" {
		fmt.Fprintf(&b, ", error: %s", sb.Error)
	}
	return b.String()
}

// summary is a sandbox as structured content.
func summary(sb *corral.Sandbox, sessionID string) map[string]any {
	m := map[string]any{"sandbox_id": sb.ID, "state": sb.State, "template": sb.Template, "runtime": sb.Runtime,
		"cpus": sb.CPUs, "memory_mb": sb.MemoryMB, "created_at": sb.CreatedAt}
	if sb.Deadline != nil {
		m["deadline"] = sb.Deadline
	}
	if sb.Network != nil {
		m["network"] = sb.Network
	}
	if sb.ID == sessionID {
		m["session"] = true
	}
	if sb.Error != "" {
		m["error"] = sb.Error
	}
	return m
}

// SandboxIn names one sandbox.
type SandboxIn struct {
	SandboxID string `json:"sandbox_id" jsonschema:"the sandbox"`
}

// ListIn is the input of sandbox_list.
type ListIn struct {
	State string `json:"state,omitempty" jsonschema:"only sandboxes in this state (running, paused, stopped, ...)"`
}

func (s *Server) sandboxList(ctx context.Context, st *session, in ListIn) (*mcp.CallToolResult, error) {
	sbs, err := st.client.List(ctx, corral.ListOptions{State: in.State})
	if err != nil {
		return nil, err
	}
	own := st.sessionID()
	var b strings.Builder
	items := []map[string]any{}
	for i := range sbs {
		fmt.Fprintf(&b, "%s\n", describe(&sbs[i], own))
		items = append(items, summary(&sbs[i], own))
	}
	if len(sbs) == 0 {
		b.WriteString("no sandboxes\n")
	}
	return textResult(b.String(), map[string]any{"sandboxes": items}), nil
}

func (s *Server) sandboxKill(ctx context.Context, st *session, in SandboxIn) (*mcp.CallToolResult, error) {
	if in.SandboxID == "" {
		return nil, invalid("sandbox_id is required")
	}
	if err := st.client.Delete(ctx, in.SandboxID); err != nil {
		return nil, err
	}
	return textResult("deleted "+in.SandboxID+"\n", map[string]any{"sandbox_id": in.SandboxID, "deleted": true}), nil
}

func (s *Server) sandboxPause(ctx context.Context, st *session, in SandboxIn) (*mcp.CallToolResult, error) {
	if in.SandboxID == "" {
		return nil, invalid("sandbox_id is required")
	}
	sb, err := st.client.Pause(ctx, in.SandboxID)
	if err != nil {
		return nil, err
	}
	return textResult(describe(sb, st.sessionID())+"\n", summary(sb, st.sessionID())), nil
}

// ResumeIn is the input of sandbox_resume.
type ResumeIn struct {
	SandboxID string `json:"sandbox_id" jsonschema:"the sandbox"`
	Timeout   int    `json:"timeout_seconds,omitempty" jsonschema:"delete it this many seconds from now; default: keep the time it had left"`
}

func (s *Server) sandboxResume(ctx context.Context, st *session, in ResumeIn) (*mcp.CallToolResult, error) {
	if in.SandboxID == "" {
		return nil, invalid("sandbox_id is required")
	}
	timeout, err := seconds("timeout_seconds", in.Timeout, 30*24*3600)
	if err != nil {
		return nil, err
	}
	sb, err := st.client.Get(ctx, in.SandboxID)
	if err != nil {
		return nil, err
	}
	switch {
	case sb.State != "paused" && sb.State != "stopped":
		return nil, &corral.Error{Status: 409, Code: corral.CodeFailedPrecondition,
			Message: fmt.Sprintf("sandbox %s is %s, not paused or stopped", sb.ID, sb.State)}
	case timeout > 0:
		if sb.State == "paused" {
			_, err = st.client.Resume(ctx, sb.ID, &timeout)
		} else {
			_, err = st.client.Start(ctx, sb.ID, &timeout)
		}
	default:
		err = resumeOrStart(ctx, st.client, sb)
	}
	if err != nil {
		return nil, err
	}
	if sb, err = st.client.Get(ctx, in.SandboxID); err != nil {
		return nil, err
	}
	return textResult(describe(sb, st.sessionID())+"\n", summary(sb, st.sessionID())), nil
}

// SnapshotIn is the input of snapshot.
type SnapshotIn struct {
	SandboxID string `json:"sandbox_id,omitempty" jsonschema:"default: this session's own sandbox"`
	Name      string `json:"name,omitempty" jsonschema:"the snapshot's name; default: generated"`
}

func (s *Server) snapshot(ctx context.Context, st *session, in SnapshotIn) (*mcp.CallToolResult, error) {
	id, err := s.sandboxFor(ctx, st, in.SandboxID)
	if err != nil {
		return nil, err
	}
	name := in.Name
	if name == "" {
		name = "mcp-" + newTag()
	}
	snap, err := st.client.CreateSnapshotWith(ctx, id, corral.SnapshotOptions{Name: name,
		Metadata: map[string]string{SessionKey: st.tag}})
	if err != nil {
		return nil, err
	}
	return textResult(fmt.Sprintf("snapshot %s of %s (%s, %d bytes); start sandboxes from it with sandbox_create from_snapshot=%q\n",
		snap.Name, id, snap.Kind, snap.SizeBytes, snap.Name),
		map[string]any{"name": snap.Name, "sandbox_id": id, "kind": snap.Kind, "size_bytes": snap.SizeBytes}), nil
}

// ForkIn is the input of fork.
type ForkIn struct {
	SandboxID string `json:"sandbox_id,omitempty" jsonschema:"the sandbox to copy; default: this session's own sandbox"`
	Count     int    `json:"count,omitempty" jsonschema:"how many copies; default 1, at most 16"`
}

func (s *Server) fork(ctx context.Context, st *session, in ForkIn) (*mcp.CallToolResult, error) {
	n := in.Count
	if n == 0 {
		n = 1
	}
	if n < 1 || n > 16 {
		return nil, invalid("count must be between 1 and 16")
	}
	id, err := s.sandboxFor(ctx, st, in.SandboxID)
	if err != nil {
		return nil, err
	}
	src, err := st.client.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	// Copies get the source's runtime and network, which must be what
	// the policy allows a sandbox to have.
	if err := s.checkRuntime(src.Runtime); err != nil {
		return nil, err
	}
	if err := s.checkNetwork(src.Network); err != nil {
		return nil, err
	}
	st.createMu.Lock()
	defer st.createMu.Unlock()
	if err := s.checkCount(ctx, st, n); err != nil {
		return nil, err
	}
	copies, err := st.client.Fork(ctx, id, n)
	if err != nil {
		return nil, err
	}
	for i := range copies {
		st.own(copies[i].ID)
	}
	var b strings.Builder
	ids := []string{}
	for i := range copies {
		ids = append(ids, copies[i].ID)
		fmt.Fprintf(&b, "%s\n", describe(&copies[i], ""))
	}
	return textResult(b.String(), map[string]any{"source": id, "sandbox_ids": ids}), nil
}
