// Package consistency holds tests that keep the repository's promises about
// itself: the public SDK imports nothing internal, the guest agent links
// nothing of the daemon, the binaries are static, and
// the SDK's JSON shapes match the server's.
package consistency

import (
	"debug/elf"
	"os/exec"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/corralrun/corral/internal/audit"
	"github.com/corralrun/corral/internal/cluster"
	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/sandbox"
	"github.com/corralrun/corral/internal/server"
	"github.com/corralrun/corral/internal/storage"
	"github.com/corralrun/corral/internal/testutil"
	"github.com/corralrun/corral/internal/wire"
	corral "github.com/corralrun/corral/sdk"
)

func TestSDKImportsNothingInternal(t *testing.T) {
	testutil.RequiresBinary(t, "go")
	out, err := exec.Command("go", "list", "-deps", "github.com/corralrun/corral/sdk").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, pkg := range strings.Fields(string(out)) {
		if strings.HasPrefix(pkg, "github.com/corralrun/corral/") && pkg != "github.com/corralrun/corral/sdk" {
			t.Errorf("sdk depends on %s", pkg)
		}
	}
}

// agentInternal lists the internal packages the guest agent may link: the
// agent runs inside every sandbox, so it carries nothing of the daemon.
// The code interpreter service is the agent binary's "interpreter"
// command (the code-interpreter template's start command); vmguest is
// what the agent does first as a VM's init.
var agentInternal = map[string]bool{
	"errdefs":      true,
	"agentdialout": true,
	"seccomp":      true,
	"untar":        true,
	"wire":         true,
	"agentserver":  true,
	"interpreter":  true,
	"vmguest":      true,
}

// agentForbidden names module path prefixes the agent must never link:
// SQLite, registry clients and nftables.
var agentForbidden = []string{
	"modernc.org/sqlite",
	"github.com/google/go-containerregistry",
	"github.com/containers/image",
	"github.com/google/nftables",
	"github.com/mdlayher/netlink",
	"github.com/vishvananda/netlink",
}

func TestAgentLinksNothingOfTheDaemon(t *testing.T) {
	testutil.RequiresBinary(t, "go")
	out, err := exec.Command("go", "list", "-deps", "github.com/corralrun/corral/cmd/corral-agent").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	const internal = "github.com/corralrun/corral/internal/"
	for _, pkg := range strings.Fields(string(out)) {
		if name, ok := strings.CutPrefix(pkg, internal); ok && !agentInternal[name] {
			t.Errorf("corral-agent depends on %s", pkg)
		}
		for _, f := range agentForbidden {
			if pkg == f || strings.HasPrefix(pkg, f+"/") {
				t.Errorf("corral-agent depends on %s", pkg)
			}
		}
	}
}

func TestBinaryIsStatic(t *testing.T) {
	for _, bin := range []string{testutil.CorralBinary(t), testutil.AgentBinary(t)} {
		f, err := elf.Open(bin)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP {
				t.Errorf("%s has a dynamic loader (PT_INTERP): it must build with CGO_ENABLED=0", filepath.Base(bin))
			}
		}
		if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
			t.Errorf("%s links shared libraries %v", filepath.Base(bin), libs)
		}
		f.Close()
	}
}

// jsonFields returns the JSON field names of a struct type.
func jsonFields(t reflect.Type) []string {
	var out []string
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" || !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out = append(out, name)
	}
	sort.Strings(out)
	return out
}

func TestSDKShapesMatchServer(t *testing.T) {
	pairs := []struct {
		name        string
		sdk, server any
	}{
		{"sandbox", corral.Sandbox{}, server.SandboxView{}},
		{"audit record", corral.AuditRecord{}, audit.Record{}},
		{"key", corral.Key{}, server.KeyView{}},
		{"key options", corral.KeyOptions{}, server.KeyRequest{}},
		{"secret", corral.Secret{}, server.SecretView{}},
		{"network policy", corral.NetworkPolicy{}, server.NetworkPolicy{}},
		{"header rule", corral.HeaderRule{}, server.HeaderRule{}},
		{"placeholder rule", corral.PlaceholderRule{}, server.PlaceholderRule{}},
		{"file info", corral.FileInfo{}, wire.FileInfo{}},
		{"template", corral.Template{}, sandbox.Template{}},
		{"stats", corral.Stats{}, driver.Stats{}},
		{"update", corral.UpdateOptions{}, server.UpdateRequest{}},
		{"version", corral.Version{}, server.VersionInfo{}},
		{"health", corral.Health{}, server.Health{}},
		{"disk quota", corral.DiskQuota{}, storage.QuotaStatus{}},
		{"build options", corral.BuildOptions{}, server.BuildRequest{}},
		{"process", corral.Process{}, wire.ProcessInfo{}},
		{"pty size", corral.PTYSize{}, wire.PTYSize{}},
		{"watch event", corral.WatchEvent{}, wire.WatchEvent{}},
		{"pool", corral.Pool{}, server.PoolView{}},
		{"pool options", corral.PoolOptions{}, server.PoolRequest{}},
		{"volume", corral.Volume{}, sandbox.Volume{}},
		{"fork options", corral.ForkOptions{}, server.ForkRequest{}},
		{"snapshot options", corral.SnapshotOptions{}, server.SnapshotRequest{}},
		{"snapshot", corral.Snapshot{}, server.SnapshotView{}},
		{"mount", corral.Mount{}, server.Mount{}},
		{"pull options", corral.PullOptions{}, server.PullRequest{}},
		{"service", corral.Service{}, sandbox.Service{}},
		{"ready check", corral.ReadyCheck{}, wire.ReadyCheck{}},
		{"service status", corral.ServiceStatus{}, wire.ServiceStatus{}},
		{"node", corral.Node{}, cluster.Node{}},
		{"node capacity", corral.NodeCapacity{}, cluster.Capacity{}},
		{"node load", corral.NodeLoad{}, cluster.Load{}},
	}
	for _, p := range pairs {
		t.Run(p.name, func(t *testing.T) {
			if diff := cmp.Diff(jsonFields(reflect.TypeOf(p.server)), jsonFields(reflect.TypeOf(p.sdk))); diff != "" {
				t.Fatalf("JSON fields differ (-server +sdk):\n%s", diff)
			}
		})
	}
}
