package daemon

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/corralrun/corral/internal/egress"
	"github.com/corralrun/corral/internal/sandbox"
)

// poolsFlag is the repeatable --pool flag:
// name=NAME,template=T[,runtime=R][,size=N][,cpus=C][,memory=M][,pids=N][,disk=D][,network=MODE].
type poolsFlag struct{ v *[]sandbox.Pool }

func (f poolsFlag) String() string {
	if f.v == nil {
		return ""
	}
	var names []string
	for _, p := range *f.v {
		names = append(names, p.Name)
	}
	return strings.Join(names, ",")
}

func (f poolsFlag) Set(s string) error {
	p := sandbox.Pool{Size: 1}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if !ok || v == "" {
			return fmt.Errorf("want KEY=VALUE pairs, got %q", kv)
		}
		var err error
		switch k {
		case "name":
			p.Name = v
		case "template":
			p.Template = v
		case "runtime":
			p.Runtime = v
		case "network":
			p.Network = egress.Mode(v)
		case "size":
			p.Size, err = strconv.Atoi(v)
			if err == nil && p.Size < 0 {
				err = fmt.Errorf("negative")
			}
		case "cpus":
			err = cpuFlag{&p.MilliCPUs}.Set(v)
		case "memory":
			err = sizeFlag{&p.MemoryBytes}.Set(v)
		case "pids":
			p.Pids, err = strconv.ParseInt(v, 10, 64)
		case "disk":
			err = sizeFlag{&p.DiskBytes}.Set(v)
		default:
			return fmt.Errorf("unknown pool key %q (name, template, runtime, size, cpus, memory, pids, disk, network)", k)
		}
		if err != nil {
			return fmt.Errorf("pool %s %q: %w", k, v, err)
		}
	}
	if p.Name == "" || p.Template == "" {
		return fmt.Errorf("a pool needs name= and template=")
	}
	*f.v = append(*f.v, p)
	return nil
}

// setPools defines the pools of the configuration, after the Manager
// started (and reloaded the pools kept in the store). A pool that cannot be
// defined, such as one whose template does not exist yet, is logged and
// skipped: the daemon serves without it, and `corral pool set` can define
// it later.
func (d *Daemon) setPools(ctx context.Context, pools []sandbox.Pool) {
	for _, p := range pools {
		if _, err := d.manager.SetPool(ctx, p); err != nil {
			d.log.Error("defining pool from the configuration", "pool", p.Name, "err", err)
		}
	}
}
