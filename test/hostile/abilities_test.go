package hostile

import (
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// matches reports whether a probe's outcome got is the outcome want of
// wantProbes: the same, or for "fails" any error (a missing line is no
// answer at all).
func matches(want, got string) bool {
	return got == want || (want == "fails" && got != "ok" && got != "")
}

// hostLacks returns, for each probe that depends on an ability of the host
// (a compat ABI, a kernel feature, a capability of host root) which this
// host lacks, the reason. Without the ability a probe gets a confined
// outcome even unconfined, so in a sandbox it shows nothing about the
// confinement. The ABIs are tried on the host itself, unconfined.
func hostLacks(t testing.TB, attack []byte) map[string]string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "attack")
	if err := os.WriteFile(bin, attack, 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "abis").Output()
	if err != nil {
		t.Fatalf("attack abis on the host: %v", err)
	}
	host := probes(string(out))
	lacks := map[string]string{}
	for _, p := range []string{"i386-abi", "x32-abi"} {
		got, ok := host[p]
		if !ok {
			t.Fatalf("attack abis on the host: no %s line in %q", p, out)
		}
		if matches(wantProbes[p], got) {
			lacks[p] = fmt.Sprintf("the host's kernel has no %s ABI (getpid through it: %s on the host, unconfined)",
				strings.TrimSuffix(p, "-abi"), got)
		}
	}
	if _, err := os.Stat("/proc/sysrq-trigger"); err != nil {
		lacks["write-sysrq-trigger"] = "the host's kernel has no magic SysRq (no /proc/sysrq-trigger)"
	}
	if !hasCap(unix.CAP_SYS_RESOURCE) {
		lacks["lower-oom-score"] = "host root lacks CAP_SYS_RESOURCE, which lowering an OOM score needs"
	}
	return lacks
}

// forHost returns want where every probe the host lacks an ability for,
// and that must fail in a sandbox, only has to fail: the host refuses it
// unconfined too, so any refusal is as confined as a sandbox can make it.
func forHost(want, lacks map[string]string) map[string]string {
	m := maps.Clone(want)
	for p := range lacks {
		if m[p] != "ok" {
			m[p] = "fails"
		}
	}
	return m
}

// hasCap reports whether this process has capability bit c in its
// effective set.
func hasCap(c uint) bool {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			var eff uint64
			fmt.Sscanf(strings.TrimSpace(v), "%x", &eff)
			return eff&(1<<c) != 0
		}
	}
	return false
}
