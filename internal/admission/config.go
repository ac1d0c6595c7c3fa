package admission

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// Config bounds what the daemon accepts, decided before a create
// acquires anything. Zero fields mean no bound.
//
// Host capacity (MaxSandboxes and the commit ratios) is the server's: a
// create over it fails with errdefs.ErrBusy (HTTP 503), or waits in a
// bounded FIFO queue when QueueLength and MaxWait allow. The per-principal
// limit is the caller's own: a create over it fails at once with
// errdefs.ErrResourceExhausted (HTTP 429). Both carry a retry hint
// (errdefs.RetryAfter).
//
// MaxStarting bounds the creates that run at once, from storage to the
// agent's ready answer: a create that fits host capacity takes its share
// of it, then waits in the same FIFO queue for a starting slot (up to
// StartQueueLength waiters, each for StartWait) or is refused with
// errdefs.ErrBusy. Creates of warm pool members take slots too, but only
// when no other create waits for one, and do not count against
// StartQueueLength (the pool's own concurrency bounds them).
type Config struct {
	// MaxSandboxes bounds the sandboxes that exist or are being created.
	MaxSandboxes int
	// MemoryCommitRatio bounds the sum of sandboxes' memory limits to
	// HostMemoryBytes times the ratio; CPUCommitRatio bounds the sum of
	// their CPU limits to HostMilliCPUs times the ratio. Sandboxes without
	// a limit count as zero.
	MemoryCommitRatio float64
	CPUCommitRatio    float64
	// HostMemoryBytes and HostMilliCPUs are the host's size (default:
	// MemTotal of /proc/meminfo and the CPUs this process may use).
	HostMemoryBytes int64
	HostMilliCPUs   int64
	// MaxPerPrincipal bounds the sandboxes one principal (an API key, the
	// unix socket; see WithPrincipal) has or is creating at a time.
	MaxPerPrincipal int
	// QueueLength is how many creates may wait for host capacity at once
	// and MaxWait how long each may wait; without both a create over
	// capacity fails at once.
	QueueLength int
	MaxWait     time.Duration
	// MaxStarting bounds the creates being started at once: more would
	// share the host's CPUs so thinly that each runs past its runtime's
	// start timeout (see StartingPerCPU).
	MaxStarting int
	// StartQueueLength is how many creates may wait for a starting slot
	// at once and StartWait how long each may wait (required with a
	// queue); without a queue a create that finds every slot taken fails
	// at once.
	StartQueueLength int
	StartWait        time.Duration
	// RetryAfter is the hint sent with refusals (default 1s).
	RetryAfter time.Duration
}

// The starting limits of a daemon that names none: per CPU this process
// may use, the creates started at once and those that may wait for a
// slot, and how long each may wait. They keep every start far inside the
// runtimes' start timeout (gVisor's starts are the slowest) and let a full
// queue drain within StartWait.
const (
	StartingPerCPU   = 2
	StartQueuePerCPU = 32
	DefaultStartWait = 10 * time.Second
)

// The reasons of admission refusals, as counted in metrics.
const (
	RefusedSandboxes = "max_sandboxes"
	RefusedMemory    = "memory"
	RefusedCPU       = "cpu"
	RefusedPrincipal = "per_principal"
	RefusedQueueFull = "queue_full"
	RefusedWait      = "wait_timeout"
	// Refusals for want of a starting slot: every slot taken and no start
	// queue, the start queue full, the wait for a slot too long.
	RefusedStarting       = "starting"
	RefusedStartQueueFull = "start_queue_full"
	RefusedStartWait      = "start_wait_timeout"
)

// Hooks are told what a Controller decides, for metrics. They may be
// called with the Controller's lock held, so they must not block or call
// back into it; nil hooks are skipped.
type Hooks struct {
	// Refused is called once per refusal with its reason (the Refused*
	// constants).
	Refused func(reason string)
	// Queued is called with the number of waiting creates whenever it
	// changes.
	Queued func(n int)
}

// New checks cfg and returns a Controller that keeps its budget; hooks
// are told of refusals and of the queue's length.
func New(cfg Config, hooks Hooks) (*Controller, error) {
	if cfg.MaxSandboxes < 0 || cfg.MaxPerPrincipal < 0 || cfg.QueueLength < 0 || cfg.MaxWait < 0 ||
		cfg.MemoryCommitRatio < 0 || cfg.CPUCommitRatio < 0 ||
		cfg.MaxStarting < 0 || cfg.StartQueueLength < 0 || cfg.StartWait < 0 {
		return nil, errors.New("admission limits must not be negative")
	}
	if (cfg.QueueLength > 0) != (cfg.MaxWait > 0) {
		return nil, errors.New("an admission queue needs both a length and a maximum wait")
	}
	if cfg.StartQueueLength > 0 && cfg.StartWait == 0 {
		return nil, errors.New("a start queue needs a maximum wait")
	}
	if cfg.StartQueueLength == 0 {
		cfg.StartWait = 0
	}
	if cfg.RetryAfter <= 0 {
		cfg.RetryAfter = time.Second
	}
	a := &Controller{cfg: cfg, held: map[string]Claim{}, perKey: map[string]int{}, onRefuse: hooks.Refused, onQueue: hooks.Queued}
	if a.onRefuse == nil {
		a.onRefuse = func(string) {}
	}
	if a.onQueue == nil {
		a.onQueue = func(int) {}
	}
	if cfg.MemoryCommitRatio > 0 {
		host, err := cfg.hostMemoryBytes()
		if err != nil {
			return nil, err
		}
		a.memCap = int64(float64(host) * cfg.MemoryCommitRatio)
	}
	if cfg.CPUCommitRatio > 0 {
		a.cpuCap = int64(float64(cfg.hostMilliCPUs()) * cfg.CPUCommitRatio)
	}
	return a, nil
}

// Host returns the host's size as commit ratios count it: HostMilliCPUs
// and HostMemoryBytes, or, for those left zero, the defaults they
// document. It reads /proc/meminfo unless HostMemoryBytes is set.
func (c Config) Host() (milliCPUs, memoryBytes int64, err error) {
	memoryBytes, err = c.hostMemoryBytes()
	return c.hostMilliCPUs(), memoryBytes, err
}

func (c Config) hostMilliCPUs() int64 {
	if c.HostMilliCPUs > 0 {
		return c.HostMilliCPUs
	}
	return int64(runtime.NumCPU()) * 1000
}

func (c Config) hostMemoryBytes() (int64, error) {
	if c.HostMemoryBytes > 0 {
		return c.HostMemoryBytes, nil
	}
	return hostMemory()
}

// hostMemory reads MemTotal from /proc/meminfo.
func hostMemory() (int64, error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, fmt.Errorf("reading host memory: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "MemTotal:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("parsing MemTotal %q: %w", rest, err)
			}
			return kb << 10, nil
		}
	}
	return 0, errors.New("reading host memory: no MemTotal in /proc/meminfo")
}
