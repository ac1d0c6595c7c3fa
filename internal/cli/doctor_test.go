package cli

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/corralrun/corral/internal/doctor"
)

// TestDoctor runs `corral doctor` on this host: it needs no daemon, and
// both forms list every runtime and storage backend.
func TestDoctor(t *testing.T) {
	var out, errOut bytes.Buffer
	env := Env{Stdin: strings.NewReader(""), Stdout: &out, Stderr: &errOut, Getenv: func(string) string { return "unix:///nonexistent.sock" }}
	code := Main([]string{"doctor", "--json"}, env, nil, nil)
	var r doctor.Report
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		t.Fatalf("doctor --json: exit %d, %v\n%s%s", code, err, out.String(), errOut.String())
	}
	var names []string
	for _, rt := range append(r.Runtimes, r.Storage...) {
		names = append(names, rt.Name)
	}
	if got := strings.Join(names, ","); got != "runc,gvisor,vm,btrfs,overlay" {
		t.Errorf("runtimes and storage = %s", got)
	}
	out.Reset()
	Main([]string{"doctor"}, env, nil, nil)
	for _, want := range []string{"CHECK", "RUNTIME", "STORAGE", "gvisor", "runsc", "vm-kernel", "note: VMs run under"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("doctor output lacks %q:\n%s", want, out.String())
		}
	}
}
