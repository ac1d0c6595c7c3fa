package daemon

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/corralrun/corral/internal/sandbox"
)

func TestSizeFlag(t *testing.T) {
	tests := []struct {
		in   string
		want int64
		bad  bool
	}{
		{in: "0", want: 0},
		{in: "512M", want: 512 << 20},
		{in: "2G", want: 2 << 30},
		{in: "1.5g", want: 3 << 29},
		{in: "10GiB", want: 10 << 30},
		{in: "100MB", want: 100 << 20},
		{in: "4096", want: 4096},
		{in: "64k", want: 64 << 10},
		{in: "-1", bad: true},
		{in: "lots", bad: true},
		{in: "", bad: true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			var v int64
			err := sizeFlag{&v}.Set(tt.in)
			if (err != nil) != tt.bad {
				t.Fatalf("Set(%q) error = %v, want error %v", tt.in, err, tt.bad)
			}
			if !tt.bad && v != tt.want {
				t.Errorf("Set(%q) = %d, want %d", tt.in, v, tt.want)
			}
		})
	}
	v := int64(512 << 20)
	if got := (sizeFlag{&v}).String(); got != "512M" {
		t.Errorf("String() = %q, want 512M", got)
	}
}

func TestCPUFlag(t *testing.T) {
	var v int64
	if err := (cpuFlag{&v}).Set("1.5"); err != nil || v != 1500 {
		t.Errorf("Set(1.5) = %d, %v; want 1500", v, err)
	}
	if err := (cpuFlag{&v}).Set("-2"); err == nil {
		t.Error("Set(-2) succeeded")
	}
	if got := (cpuFlag{&v}).String(); got != "1.5" {
		t.Errorf("String() = %q, want 1.5", got)
	}
}

func TestCheckLimits(t *testing.T) {
	def := DefaultLimits()
	if err := checkLimits(def, sandbox.Limits{}); err != nil {
		t.Errorf("no maximum: %v", err)
	}
	if err := checkLimits(def, sandbox.Limits{MemoryBytes: 256 << 20}); err == nil {
		t.Error("default memory above the maximum accepted")
	}
	if err := checkLimits(def, sandbox.Limits{MemoryBytes: 1 << 30, MilliCPUs: 2000, Pids: 4096}); err != nil {
		t.Errorf("maximum above the defaults: %v", err)
	}
}

func TestDefaultDiskNeedsBtrfs(t *testing.T) {
	c := Config{StateDir: t.TempDir(), Storage: "overlay", AgentPath: "/bin/true",
		Defaults: sandbox.Limits{DiskBytes: 1 << 30}}
	if err := c.setDefaults(); err == nil {
		t.Error("a default disk limit with overlay storage was accepted")
	}
	c.Storage = "btrfs"
	if err := c.setDefaults(); err != nil {
		t.Errorf("btrfs: %v", err)
	}
}

func TestPoolsFlag(t *testing.T) {
	var got []sandbox.Pool
	f := poolsFlag{&got}
	for _, s := range []string{
		"name=py,template=default,runtime=gvisor,size=8,cpus=0.5,memory=256M,pids=64,network=open",
		"name=bb,template=bb",
	} {
		if err := f.Set(s); err != nil {
			t.Fatalf("Set(%q): %v", s, err)
		}
	}
	want := []sandbox.Pool{
		{Name: "py", Template: "default", Runtime: "gvisor", Size: 8, MilliCPUs: 500, MemoryBytes: 256 << 20, Pids: 64, Network: "open"},
		{Name: "bb", Template: "bb", Size: 1},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("pools (-want +got):\n%s", diff)
	}
	for _, bad := range []string{"name=x", "template=t", "name=x,template=t,size=-1", "name=x,template=t,color=red", "name=x,template=t,memory=lots", "name=x,,template=t"} {
		if err := f.Set(bad); err == nil {
			t.Errorf("Set(%q) accepted", bad)
		}
	}
}
