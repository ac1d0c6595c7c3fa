package daemon

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestAllowMountFlag(t *testing.T) {
	cfg, ok := parseFlags([]string{"--allow-mount", "/srv/work/", "--allow-mount", "/home/u/proj"})
	if !ok {
		t.Fatal("parseFlags refused two --allow-mount")
	}
	cfg.StateDir, cfg.AgentPath = t.TempDir(), "/bin/true"
	if err := cfg.setDefaults(); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"/srv/work", "/home/u/proj"}, cfg.AllowMounts); diff != "" {
		t.Fatalf("AllowMounts (-want +got):\n%s", diff)
	}
	if cfg, ok := parseFlags(nil); !ok || cfg.AllowMounts != nil {
		t.Fatalf("without the flag: AllowMounts %q, ok %v; want none", cfg.AllowMounts, ok)
	}
}

func TestAllowMountMustBeAbsolute(t *testing.T) {
	for _, dir := range []string{"work", "./work", ""} {
		c := Config{StateDir: t.TempDir(), AgentPath: "/bin/true", AllowMounts: []string{"/srv", dir}}
		if err := c.setDefaults(); err == nil {
			t.Errorf("--allow-mount %q was accepted", dir)
		}
	}
}

func TestE2BBuildNetworkFlags(t *testing.T) {
	for _, tt := range []struct {
		args []string
		ok   bool
	}{
		{nil, true},
		{[]string{"--e2b-build-network", "open"}, true},
		{[]string{"--e2b-build-network", "allowlist", "--e2b-build-allow-domain", "deb.debian.org"}, true},
		{[]string{"--e2b-build-network", "wide"}, false},
		{[]string{"--e2b-build-allow-domain", "deb.debian.org"}, false},
	} {
		cfg, ok := parseFlags(tt.args)
		if !ok {
			t.Fatalf("parseFlags(%q) refused", tt.args)
		}
		cfg.StateDir, cfg.AgentPath = t.TempDir(), "/bin/true"
		if err := cfg.setDefaults(); (err == nil) != tt.ok {
			t.Errorf("%q: %v, want ok %v", tt.args, err, tt.ok)
		}
	}
}
