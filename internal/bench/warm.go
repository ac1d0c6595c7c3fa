package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	corral "github.com/corralrun/corral/sdk"
)

// warmPoolSize is the size of the warm claim scenario's pool.
const warmPoolSize = 2

// warmClaim defines a pool of the run's template and runtime, then times
// Create (which claims from it) + Exec `echo hi` to the first stdout byte.
// Before each claim it waits, untimed, until the pool is full and idle, so
// every sample is a claim (not a cold create) taken without a refill
// competing for the CPU. Claimed sandboxes are deleted untimed; the pool is
// deleted at the end.
func (r *runner) warmClaim(ctx context.Context, runtime string) ([]Row, error) {
	row := Row{Scenario: ScenarioWarm, Runtime: runtime}
	fail := func(err error) ([]Row, error) {
		err = fmt.Errorf("%s: %w", ScenarioWarm, err)
		row.Extra = "error: " + err.Error()
		return []Row{row}, err
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	name := "corral-bench-" + hex.EncodeToString(b[:])
	if _, err := r.c.SetPool(ctx, name, corral.PoolOptions{Template: r.opts.Template, Runtime: r.opts.Runtime, Size: warmPoolSize}); err != nil {
		return fail(err)
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		_ = r.c.DeletePool(dctx, name)
	}()
	samples := make([]time.Duration, 0, r.opts.Iterations)
	for i := 0; i < r.opts.Iterations; i++ {
		if err := r.waitPoolFull(ctx, name); err != nil {
			return fail(err)
		}
		err := func() error {
			fb := &firstByte{start: time.Now()}
			sb, err := r.c.Create(ctx, corral.CreateOptions{Pool: name})
			if err != nil {
				return err
			}
			r.mu.Lock()
			r.live[sb.ID] = true
			r.mu.Unlock()
			defer r.del(ctx, sb.ID)
			if _, err := r.c.Exec(ctx, sb.ID, corral.ExecOptions{Cmd: []string{"echo", "hi"}, Stdout: fb}); err != nil {
				return err
			}
			if fb.at == 0 {
				return errors.New("echo hi printed nothing")
			}
			samples = append(samples, fb.at)
			return nil
		}()
		if err != nil {
			return fail(err)
		}
	}
	row = latencyRow(ScenarioWarm, runtime, samples)
	row.Extra = fmt.Sprintf("pool of %d, full and idle before each claim", warmPoolSize)
	return []Row{row}, nil
}

// waitPoolFull waits until pool name has all its sandboxes ready and none
// being made, or reports the pool's refill error after a minute.
func (r *runner) waitPoolFull(ctx context.Context, name string) error {
	deadline := time.Now().Add(time.Minute)
	for {
		p, err := r.c.GetPool(ctx, name)
		if err != nil {
			return err
		}
		if p.Ready == p.Size && p.Filling == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pool %s not full after a minute (ready %d of %d; last error: %q)", name, p.Ready, p.Size, p.Error)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}
