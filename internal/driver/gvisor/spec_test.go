package gvisor

import (
	"encoding/json"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/driver/runc"
	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/testutil"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// TestOCISpecGolden checks the config.json of a sandbox from a shifted
// template (the default), without and with a prepared network namespace
// and host directory mounts.
func TestOCISpecGolden(t *testing.T) {
	spec := driver.Spec{ID: "sb-1", RootFS: "/var/lib/corral/roots/sb-1", Hostname: "box",
		Resources: driver.Resources{MilliCPUs: 1500, MemoryBytes: 256 << 20, Pids: 128}}
	networked := spec
	networked.Network = &driver.Network{
		NetNSPath:  "/var/lib/corral/netns/sb-1",
		ResolvConf: "/var/lib/corral/netfiles/sb-1/resolv.conf",
		Hosts:      "/var/lib/corral/netfiles/sb-1/hosts",
		Env:        []string{"HTTP_PROXY=http://10.200.0.1:15002", "NO_PROXY=localhost"},
	}
	mounted := networked
	mounted.Mounts = []driver.Mount{
		{Source: "/run/corral/mounts/sb-1/0", Target: "/data", ReadOnly: true},
		{Source: "/run/corral/mounts/sb-1/1", Target: "/data/out"},
	}
	host := runc.Host{AgentPath: "/usr/local/bin/corral", CgroupParent: "/corral", SwapAccounting: true,
		Arch: "amd64", OpenFiles: 4096, DenyIoctls: []uint64{0x50009401, 0x5000940e}}
	userns := runc.UserNS{HostID: 1 << 31, Size: 65536}
	const runDir = "/var/lib/corral/gvisor/sandboxes/sb-1/run"
	// The agent installs the filter.
	agentConfined := host
	agentConfined.InitSeccomp = "FILTER"
	tests := []struct {
		name string
		spec driver.Spec
		host runc.Host
	}{
		{"userns", spec, host},
		{"network-userns", networked, host},
		{"agent-seccomp", spec, agentConfined},
		{"mounts-network-userns", mounted, host},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := json.MarshalIndent(ociSpec(tt.spec, tt.host, userns, runDir), "", "\t")
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, '\n')
			testutil.CheckGolden(t, filepath.Join("testdata", tt.name+".json"), got, *update)
		})
	}
}

// A restore gives runsc the agent's argv that the image was taken with:
// the one the checkpoint recorded, which must be one this driver starts or
// started (with limits and program in files), or for an image from before
// the record the argv of then, without --spawn-thread.
func TestCheckpointedArgs(t *testing.T) {
	args := ociSpec(driver.Spec{ID: "sb-1", RootFS: "/r"}, runc.Host{InitSeccomp: "FILTER"}, runc.UserNS{}, "/run/sb-1").Process.Args
	if !slices.Contains(args, spawnThreadFlag) {
		t.Fatalf("new argv %q lacks %s", args, spawnThreadFlag)
	}
	files := []string{runc.AgentDest, "agent", "--dial=/.corral/run/agent.sock", "--spawn-thread", "--limits=/.corral/run/limits", "--seccomp-file=/.corral/run/seccomp"}
	legacy := []string{runc.AgentDest, "agent", "--dial=/.corral/run/agent.sock", "--limits=/.corral/run/limits", "--seccomp-file=/.corral/run/seccomp"}
	dir := t.TempDir()
	if got, err := checkpointedArgs(dir, args); err != nil || !slices.Equal(got, legacy) {
		t.Errorf("image without a record: %q, %v; want %q", got, err, legacy)
	}
	record := func(b []byte) {
		if err := os.WriteFile(filepath.Join(dir, argsFile), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, want := range [][]string{args, files, legacy} {
		b, _ := json.Marshal(want)
		record(b)
		if got, err := checkpointedArgs(dir, args); err != nil || !slices.Equal(got, want) {
			t.Errorf("recorded %q: got %q, %v", want, got, err)
		}
	}
	for _, bad := range []string{"", "[]", "{", `"x"`, `["/bin/sh","-c","true"]`, `["/.corral/agent","agent"]`} {
		record([]byte(bad))
		if _, err := checkpointedArgs(dir, args); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("record %q: %v, want ErrInvalidArgument", bad, err)
		}
	}
}
