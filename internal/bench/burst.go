package bench

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	corral "github.com/corralrun/corral/sdk"
)

// burst starts opts.Burst creates at once, then execs `echo hi` in every
// sandbox that came up, then deletes them all. A create must succeed (201)
// or be refused with 503 and a Retry-After hint, as a daemon at capacity
// answers; any other answer fails the scenario. The rate is the creates
// that succeeded over the time until the last of them answered.
func (r *runner) burst(ctx context.Context, runtime string) ([]Row, error) {
	n := r.opts.Burst
	start := time.Now()
	t := tallyBurst(r.createAtOnce(ctx, n))
	execFailed := r.echoInEach(ctx, t.created)
	delErr := r.delMany(ctx, t.created, 8)

	row := latencyRow(ScenarioBurst, runtime, t.ok)
	var rate float64
	if t.last > 0 {
		rate = float64(len(t.ok)) / t.last.Seconds()
	}
	other := n - len(t.ok) - t.refused
	otherText := "0 other"
	if other > 0 {
		otherText = fmt.Sprintf("%d other (%s)", other, fmtCounts(t.others))
	}
	row.Extra = fmt.Sprintf("%d concurrent: %d created (201), %d refused (503 with Retry-After), %s; %.1f creates/s over %.2f s; exec errors: %d",
		n, len(t.ok), t.refused, otherText, rate, t.last.Seconds(), execFailed)
	row.Metrics = map[string]float64{"created": float64(len(t.ok)), "refused": float64(t.refused), "other": float64(other),
		"creates_per_s": rate, "wall_s": time.Since(start).Seconds(), "exec_errors": float64(execFailed)}
	var err error
	if other > 0 {
		err = fmt.Errorf("%s: %d of %d creates answered neither 201 nor 503 with Retry-After: %s", ScenarioBurst, other, n, fmtCounts(t.others))
	}
	if execFailed > 0 {
		err = errors.Join(err, fmt.Errorf("%s: exec failed in %d of %d sandboxes", ScenarioBurst, execFailed, len(t.created)))
	}
	if delErr != nil {
		err = errors.Join(err, fmt.Errorf("%s: %w", ScenarioBurst, delErr))
	}
	if err != nil {
		row.Extra += "; error: " + err.Error()
	}
	return []Row{row}, err
}

// burstCreate is how one create of a burst answered.
type burstCreate struct {
	lat time.Duration
	id  string // "" when it failed
	err error
}

// createAtOnce starts n creates that wait for each other and are let go
// together, so that the daemon sees them at once.
func (r *runner) createAtOnce(ctx context.Context, n int) []burstCreate {
	res := make([]burstCreate, n)
	var wg sync.WaitGroup
	gate := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-gate
			start := time.Now()
			sb, err := r.create(ctx)
			res[i].lat = time.Since(start)
			if err != nil {
				res[i].err = err
				return
			}
			res[i].id = sb.ID
		})
	}
	close(gate)
	wg.Wait()
	return res
}

// burstTally sorts a burst's creates into successes, refusals and other
// answers.
type burstTally struct {
	ok      []time.Duration // latencies of the successes
	created []string
	refused int
	last    time.Duration  // until the last success
	others  map[string]int // other answers by error code
}

func tallyBurst(res []burstCreate) burstTally {
	t := burstTally{others: map[string]int{}}
	for _, c := range res {
		switch {
		case c.id != "":
			t.ok = append(t.ok, c.lat)
			t.created = append(t.created, c.id)
			t.last = max(t.last, c.lat)
		case isRefusal(c.err):
			t.refused++
		default:
			t.others[errCode(c.err)]++
		}
	}
	return t
}

// echoInEach execs `echo hi` in every sandbox of ids at once and returns
// how many of those execs failed.
func (r *runner) echoInEach(ctx context.Context, ids []string) int64 {
	var failed atomic.Int64
	var wg sync.WaitGroup
	for _, id := range ids {
		wg.Go(func() {
			res, err := r.c.Exec(ctx, id, corral.ExecOptions{Cmd: []string{"echo", "hi"}})
			if err != nil || res.ExitCode != 0 {
				failed.Add(1)
			}
		})
	}
	wg.Wait()
	return failed.Load()
}

// isRefusal reports whether err is a daemon at capacity asking to retry
// later: 503 with a Retry-After hint.
func isRefusal(err error) bool {
	var e *corral.Error
	return errors.As(err, &e) && e.Status == http.StatusServiceUnavailable && e.RetryAfter > 0
}

// errCode names an error for the burst's counts: the daemon's status and
// code, or what kind of client-side failure it was.
func errCode(err error) string {
	var e *corral.Error
	if errors.As(err, &e) {
		return fmt.Sprintf("%d_%s", e.Status, e.Code)
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return "canceled"
	}
	return "transport"
}
