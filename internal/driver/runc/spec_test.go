package runc

import (
	"encoding/json"
	"flag"
	"path/filepath"
	"slices"
	"testing"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/testutil"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

func TestOCISpecGolden(t *testing.T) {
	base := driver.Spec{ID: "sb-1", RootFS: "/var/lib/corral/roots/sb-1", Hostname: "box"}
	limited := base
	limited.Resources = driver.Resources{MilliCPUs: 1500, MemoryBytes: 256 << 20, Pids: 128}
	v1 := Host{AgentPath: "/usr/local/bin/corral", CgroupParent: "/corral", SwapAccounting: true,
		Arch: "amd64", OpenFiles: 4096, DenyIoctls: []uint64{0x50009401, 0x5000940e}}
	v1NoSwap := v1
	v1NoSwap.SwapAccounting = false
	v2 := v1
	v2.CgroupParent, v2.CgroupV2, v2.SwapAccounting = "corral.slice/x", true, false
	userns := UserNS{HostID: 1 << 31, Size: 65536, Path: "/proc/4242/ns/user"}
	networked := limited
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
	usernsNet := userns
	usernsNet.Sysfs = "/run/corral-rootfs/7/sys"
	tests := []struct {
		name   string
		spec   driver.Spec
		host   Host
		userns UserNS
	}{
		{"unlimited-v1", base, v1, UserNS{}},
		{"limits-v1", limited, v1, UserNS{}},
		{"limits-v1-noswap", limited, v1NoSwap, UserNS{}},
		{"limits-v2", limited, v2, UserNS{}},
		{"userns-v1", limited, v1, userns},
		{"network-v1", networked, v1, UserNS{}},
		{"network-userns-v1", networked, v1, usernsNet},
		{"mounts-network-v1", mounted, v1, UserNS{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := json.MarshalIndent(OCISpec(tt.spec, tt.host, tt.userns), "", "\t")
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, '\n')
			testutil.CheckGolden(t, filepath.Join("testdata", tt.name+".json"), got, *update)
		})
	}
}

func TestOCISpecDefaults(t *testing.T) {
	s := OCISpec(driver.Spec{ID: "abc", RootFS: "/r"}, Host{AgentPath: "/a", CgroupParent: "/p"}, UserNS{})
	if s.Hostname != "abc" {
		t.Errorf("hostname = %q, want the ID when unset", s.Hostname)
	}
	if s.Linux.CgroupsPath != "/p/abc" {
		t.Errorf("cgroupsPath = %q, want /p/abc", s.Linux.CgroupsPath)
	}
	r := s.Linux.Resources
	if r.Memory != nil || r.CPU != nil || r.Pids != nil {
		t.Errorf("zero limits produced cgroup limits: %+v", r)
	}
}

// With the filter compiled for the agent, the spec names no profile for
// runc and the agent's argv carries the program.
func TestOCISpecInitSeccomp(t *testing.T) {
	h := Host{AgentPath: "/a", CgroupParent: "/p", Arch: "amd64", DenyIoctls: []uint64{0x50009401}}
	if s := OCISpec(driver.Spec{ID: "abc", RootFS: "/r"}, h, UserNS{}); s.Linux.Seccomp == nil || len(s.Process.Args) != len(agentArgs) {
		t.Fatalf("without InitSeccomp: seccomp %v, args %v", s.Linux.Seccomp != nil, s.Process.Args)
	}
	prog, err := h.CompileSeccomp()
	if err != nil {
		t.Skipf("no seccomp compiler here: %v", err)
	}
	h.InitSeccomp = prog
	s := OCISpec(driver.Spec{ID: "abc", RootFS: "/r"}, h, UserNS{})
	if s.Linux.Seccomp != nil {
		t.Error("the spec still names a profile for runc")
	}
	if want := append(slices.Clone(agentArgs), "--seccomp="+prog); !slices.Equal(s.Process.Args, want) {
		t.Errorf("args %v", s.Process.Args)
	}
	if !s.Process.NoNewPrivileges {
		t.Error("no_new_privs is off: the agent could not install the filter")
	}
}
