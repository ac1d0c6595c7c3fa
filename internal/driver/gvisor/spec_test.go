package gvisor

import (
	"encoding/json"
	"flag"
	"path/filepath"
	"testing"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/driver/runc"
	"github.com/corralrun/corral/internal/testutil"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// TestOCISpecGolden checks the config.json of a sandbox from a shifted
// template (the default), without and with a prepared network namespace.
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
