package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	corral "github.com/corralrun/corral/sdk"
)

// Options select what Run measures. Zero counts skip their scenario.
type Options struct {
	// Runtime and Template are passed to every Create; "" takes the daemon's default.
	Runtime, Template string
	// Iterations is the number of samples of the exec, cold-start and
	// warm-claim scenarios.
	Iterations int
	// Burst is the number of concurrent creates of the burst scenario.
	Burst int
	// Density is the number of idle sandboxes of the density scenario.
	Density int
	// Peers runs the cold start on the named peers (see AllPeers),
	// interleaved with Corral's; empty runs no peers.
	Peers []string
	// Busybox is the static busybox binary the peers' rootfs is built from;
	// "" is rootfs.BusyboxPath.
	Busybox string
	// Host is the client's CORRAL_HOST, used to find the daemon's pid through
	// the unix socket for the RSS column; DaemonPID, if set, is used instead.
	Host      string
	DaemonPID int
	// Command is the command line recorded in the report.
	Command string
	// Progress, if set, receives one line as each scenario starts.
	Progress io.Writer
}

// Run runs the scenarios against the daemon c talks to and returns their
// rows. A scenario that fails is reported with the error in its row and the
// others still run; the errors are returned joined, with the partial
// report. Every sandbox and peer container Run creates is deleted before it
// returns, also when ctx is canceled. It takes minutes for the default
// sizes and must not run concurrently with itself on one daemon when the
// density numbers matter.
func Run(ctx context.Context, opts Options, c *corral.Client) (Report, error) {
	r := &runner{opts: opts, c: c, live: map[string]bool{}}
	rep := Report{Command: opts.Command, Timestamp: time.Now().UTC()}
	defer r.deleteAll()

	runtime, err := r.runtimeName(ctx)
	if err != nil {
		return rep, err
	}
	var errs []error
	add := func(rows []Row, err error) {
		rep.Rows = append(rep.Rows, rows...)
		if err != nil {
			errs = append(errs, err)
		}
	}
	if opts.Iterations > 0 {
		var ps *peerSet // nil: no peers, or none could be set up
		if len(opts.Peers) > 0 {
			var err error
			if ps, err = newPeerSet(ctx, opts.Peers, opts.Busybox); err != nil {
				add(nil, fmt.Errorf("%s: %w", ScenarioPeer, err))
			} else {
				defer ps.close()
				rep.Notes = append(rep.Notes, ps.notes...)
			}
		}
		r.progress(ScenarioExec)
		add(r.execRoundTrip(ctx, runtime, ps))
		if ctx.Err() == nil {
			r.progress(ScenarioCold)
			add(r.coldStart(ctx, runtime, ps))
		}
	}
	if opts.Iterations > 0 && ctx.Err() == nil {
		r.progress(ScenarioWarm)
		add(r.warmClaim(ctx, runtime))
	}
	// Density runs before the burst, whose hundred concurrent requests grow
	// the daemon's heap and would blur its RSS baseline; the rows keep the
	// usual order.
	var densityRow []Row
	var densityErr error
	if opts.Density > 0 && ctx.Err() == nil {
		r.progress(ScenarioDensity)
		row, note, err := r.density(ctx, runtime)
		if note != "" {
			rep.Notes = append(rep.Notes, note)
		}
		densityRow, densityErr = []Row{row}, err
	}
	if opts.Burst > 0 && ctx.Err() == nil {
		r.progress(ScenarioBurst)
		add(r.burst(ctx, runtime))
	}
	add(densityRow, densityErr)
	if err := ctx.Err(); err != nil {
		errs = append(errs, err)
	}
	return rep, errors.Join(errs...)
}

// runner holds one Run's state. live is the set of sandboxes created and
// not yet deleted, shared by the burst's goroutines.
type runner struct {
	opts Options
	c    *corral.Client
	mu   sync.Mutex
	live map[string]bool
}

func (r *runner) progress(scenario string) {
	if r.opts.Progress != nil {
		fmt.Fprintf(r.opts.Progress, "bench: %s\n", scenario)
	}
}

// runtimeName returns the runtime the sandboxes run on, for the rows.
func (r *runner) runtimeName(ctx context.Context) (string, error) {
	if r.opts.Runtime != "" {
		return r.opts.Runtime, nil
	}
	v, err := r.c.Version(ctx)
	if err != nil {
		return "", fmt.Errorf("asking the daemon for its version: %w", err)
	}
	for _, rt := range v.Runtimes {
		if rt.Default {
			return rt.Name, nil
		}
	}
	return "default", nil
}

// create creates a sandbox and remembers it until del.
func (r *runner) create(ctx context.Context) (*corral.Sandbox, error) {
	sb, err := r.c.Create(ctx, corral.CreateOptions{Template: r.opts.Template, Runtime: r.opts.Runtime})
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	r.live[sb.ID] = true
	r.mu.Unlock()
	return sb, nil
}

// del deletes a sandbox. It uses a context that outlives ctx's
// cancellation, so that an interrupted run still cleans up.
func (r *runner) del(ctx context.Context, id string) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	if err := r.c.Delete(ctx, id); err != nil && corral.ErrorCode(err) != corral.CodeNotFound {
		return fmt.Errorf("deleting sandbox %s: %w", id, err)
	}
	r.mu.Lock()
	delete(r.live, id)
	r.mu.Unlock()
	return nil
}

// deleteAll deletes every sandbox still live, four at a time.
func (r *runner) deleteAll() {
	r.mu.Lock()
	ids := make([]string, 0, len(r.live))
	for id := range r.live {
		ids = append(ids, id)
	}
	r.mu.Unlock()
	r.delMany(context.Background(), ids, 4)
}

// delMany deletes ids with at most par deletes in flight and returns the
// first error.
func (r *runner) delMany(ctx context.Context, ids []string, par int) error {
	sem := make(chan struct{}, par)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	for _, id := range ids {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if err := r.del(ctx, id); err != nil {
				mu.Lock()
				first = cmpOr(first, err)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return first
}

func cmpOr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// firstByte is an io.Writer that records when the first byte arrives. It
// is written by one goroutine (the SDK's Exec) and read after Exec returns.
type firstByte struct {
	start time.Time
	at    time.Duration
}

func (f *firstByte) Write(p []byte) (int, error) {
	if f.at == 0 && len(p) > 0 {
		f.at = time.Since(f.start)
	}
	return len(p), nil
}

// execRoundTrip times `exec /bin/true` on one sandbox, request to exit
// status, after a few untimed warm-up execs; with peers, each iteration
// also execs /bin/true in a running container of every peer OCI runtime,
// so that both see the same host noise.
func (r *runner) execRoundTrip(ctx context.Context, runtime string, ps *peerSet) ([]Row, error) {
	row := Row{Scenario: ScenarioExec, Runtime: runtime}
	fail := func(err error) ([]Row, error) {
		err = fmt.Errorf("%s: %w", ScenarioExec, err)
		row.Extra = "error: " + err.Error()
		return []Row{row}, err
	}
	sb, err := r.create(ctx)
	if err != nil {
		return fail(err)
	}
	defer r.del(ctx, sb.ID)
	peers := newPeerRuns(ps, func(p peer) bool { return p.exec != nil })
	defer peers.stop()
	for j, p := range peers.peers {
		peers.ids[j], peers.errs[j] = ps.startExecTarget(ctx, p)
	}
	opts := corral.ExecOptions{Cmd: []string{"/bin/true"}}
	samples := make([]time.Duration, 0, r.opts.Iterations)
	for i := -3; i < r.opts.Iterations; i++ {
		start := time.Now()
		res, err := r.c.Exec(ctx, sb.ID, opts)
		d := time.Since(start)
		if err == nil && res.ExitCode != 0 {
			err = fmt.Errorf("/bin/true exited with %d", res.ExitCode)
		}
		if err != nil {
			return fail(err)
		}
		peers.each(ctx, i >= 0, func(p peer, id string) (time.Duration, error) { return ps.execOnce(ctx, p, id) })
		if i >= 0 {
			samples = append(samples, d)
		}
	}
	rows := append([]Row{latencyRow(ScenarioExec, runtime, samples)}, peers.rows(ScenarioPeerExec, runtime, samples)...)
	return rows, peers.err(ScenarioPeerExec)
}

// peerRuns holds the samples of the peers of one scenario.
type peerRuns struct {
	ps      *peerSet
	peers   []peer
	ids     []string // the peers' long-running containers, if any
	samples [][]time.Duration
	errs    []error // a peer that failed once is not run again
}

// newPeerRuns prepares the peers of ps (nil: none) that keep says to.
func newPeerRuns(ps *peerSet, keep func(peer) bool) *peerRuns {
	pr := &peerRuns{ps: ps}
	if ps != nil {
		for _, p := range ps.peers {
			if keep(p) {
				pr.peers = append(pr.peers, p)
			}
		}
	}
	pr.ids = make([]string, len(pr.peers))
	pr.samples = make([][]time.Duration, len(pr.peers))
	pr.errs = make([]error, len(pr.peers))
	return pr
}

// each runs every peer that has not failed once, through run, and keeps
// the sample when record says so.
func (pr *peerRuns) each(ctx context.Context, record bool, run func(p peer, id string) (time.Duration, error)) {
	for j, p := range pr.peers {
		if pr.errs[j] != nil || ctx.Err() != nil {
			continue
		}
		d, err := run(p, pr.ids[j])
		if err != nil {
			pr.errs[j] = err
			continue
		}
		if record {
			pr.samples[j] = append(pr.samples[j], d)
		}
	}
}

// rows returns a row per peer, with the ratio of Corral's p50 (corral, on
// runtime) to the peer's.
func (pr *peerRuns) rows(scenario, runtime string, corral []time.Duration) []Row {
	corralP50 := Percentile(corral, 0.5)
	var rows []Row
	for j, p := range pr.peers {
		row := latencyRow(scenario, p.name, pr.samples[j])
		if peerP50 := Percentile(pr.samples[j], 0.5); peerP50 > 0 && corralP50 > 0 {
			ratio := Ratio(corralP50, peerP50)
			row.Extra = fmt.Sprintf("corral(%s)/%s p50 = %.2fx", runtime, p.name, ratio)
			row.Metrics = map[string]float64{"corral_ratio_p50": ratio}
		}
		if pr.errs[j] != nil {
			row.Extra = strings.TrimPrefix(row.Extra+"; error: "+pr.errs[j].Error(), "; ")
		}
		rows = append(rows, row)
	}
	return rows
}

// err joins the peers' failures, each named by scenario.
func (pr *peerRuns) err(scenario string) error {
	var errs []error
	for _, err := range pr.errs {
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", scenario, err))
		}
	}
	return errors.Join(errs...)
}

// stop removes the peers' long-running containers.
func (pr *peerRuns) stop() {
	for j, id := range pr.ids {
		if id != "" {
			pr.peers[j].cleanup(id)
		}
	}
}

// coldStart times Create + Exec `echo hi` to the first stdout byte, deleting
// each sandbox untimed; with peers, each iteration also runs every peer
// once, so that both see the same host noise.
func (r *runner) coldStart(ctx context.Context, runtime string, ps *peerSet) ([]Row, error) {
	peers := newPeerRuns(ps, func(peer) bool { return true })
	var corralSamples []time.Duration
	var err error
	for i := 0; i < r.opts.Iterations && err == nil; i++ {
		err = func() error {
			fb := &firstByte{start: time.Now()}
			sb, err := r.create(ctx)
			if err != nil {
				return err
			}
			defer r.del(ctx, sb.ID)
			if _, err := r.c.Exec(ctx, sb.ID, corral.ExecOptions{Cmd: []string{"echo", "hi"}, Stdout: fb}); err != nil {
				return err
			}
			if fb.at == 0 {
				return errors.New("echo hi printed nothing")
			}
			corralSamples = append(corralSamples, fb.at)
			return nil
		}()
		if err != nil {
			err = fmt.Errorf("%s: %w", ScenarioCold, err)
		}
		peers.each(ctx, true, func(p peer, _ string) (time.Duration, error) { return ps.run(ctx, p) })
	}
	cold := latencyRow(ScenarioCold, runtime, corralSamples)
	if err != nil {
		cold.Extra = "error: " + err.Error()
	}
	rows := append([]Row{cold}, peers.rows(ScenarioPeer, runtime, corralSamples)...)
	return rows, errors.Join(err, peers.err(ScenarioPeer))
}

// density creates opts.Density idle sandboxes one after another, then
// reports their summed cgroup memory per sandbox and the daemon's RSS
// growth per sandbox, then deletes them. p50/p99 are of the create
// latency while filling.
func (r *runner) density(ctx context.Context, runtime string) (Row, string, error) {
	n := r.opts.Density
	row := Row{Scenario: ScenarioDensity, Runtime: runtime}
	pid, note := r.daemonPID(ctx)
	var rssBefore int64
	if pid > 0 {
		var err error
		if rssBefore, err = RSSBytes(pid); err != nil {
			pid, note = 0, "daemon RSS column skipped: "+err.Error()
		}
	}
	ids := make([]string, 0, n)
	var lat []time.Duration
	var err error
	for range n {
		start := time.Now()
		var sb *corral.Sandbox
		if sb, err = r.create(ctx); err != nil {
			err = fmt.Errorf("%s: creating sandbox %d of %d: %w", ScenarioDensity, len(ids)+1, n, err)
			break
		}
		lat = append(lat, time.Since(start))
		ids = append(ids, sb.ID)
	}
	defer r.delMany(ctx, ids, 8)
	if len(ids) == 0 {
		row.Extra = "error: " + err.Error()
		return row, note, err
	}
	row = latencyRow(ScenarioDensity, runtime, lat)
	var mem int64
	for _, id := range ids {
		st, serr := r.c.Stats(ctx, id)
		if serr != nil {
			err = errors.Join(err, fmt.Errorf("%s: reading stats of %s: %w", ScenarioDensity, id, serr))
			break
		}
		mem += st.MemoryBytes
	}
	k := float64(len(ids))
	perSandbox := float64(mem) / k
	row.Extra = fmt.Sprintf("%d idle; sandbox memory %s each", len(ids), fmtBytes(perSandbox))
	row.Metrics = map[string]float64{"sandboxes": k, "memory_bytes_per_sandbox": perSandbox}
	if pid > 0 {
		if rssAfter, rerr := RSSBytes(pid); rerr == nil {
			growth := float64(rssAfter-rssBefore) / k
			row.Extra += fmt.Sprintf("; daemon RSS %s -> %s, %s per sandbox",
				fmtBytes(float64(rssBefore)), fmtBytes(float64(rssAfter)), fmtBytes(growth))
			row.Metrics["daemon_rss_bytes_per_sandbox"] = growth
		} else {
			note = "daemon RSS column skipped: " + rerr.Error()
		}
	}
	row.Extra += "; p50/p99 = create latency while filling"
	if err != nil {
		row.Extra += "; error: " + err.Error()
	}
	return row, note, err
}

// daemonPID returns the daemon's pid, or 0 and why the RSS column is skipped.
func (r *runner) daemonPID(ctx context.Context) (int, string) {
	if r.opts.DaemonPID > 0 {
		return r.opts.DaemonPID, ""
	}
	path, ok := SocketPath(r.opts.Host)
	if !ok {
		return 0, "daemon RSS column skipped: the daemon is not on a unix socket (pass --daemon-pid)"
	}
	pid, err := PeerPID(ctx, path)
	if err != nil {
		return 0, "daemon RSS column skipped: " + err.Error()
	}
	return pid, ""
}
