package e2e

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	corral "github.com/corralrun/corral/sdk"
)

// readyDirs lists the ready snapshots in the daemon's snapshot directory.
func readyDirs(t testing.TB, d *daemon) []string {
	t.Helper()
	entries, _ := os.ReadDir(d.snapshotDir())
	var out []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "_ready-") {
			out = append(out, e.Name())
		}
	}
	return out
}

// TestReadySnapshotGVisor captures the bb template ready on gVisor through
// the CLI, and checks that a default create restores it (the restored
// kernel keeps the capture sandbox's hostname, where a cold create gets
// its own ID), that other limits create cold, that the capture leaves no
// sandbox behind, and that drop and template delete leave no snapshot.
func TestReadySnapshotGVisor(t *testing.T) {
	d := startGVisorDaemon(t)
	ctx := t.Context()
	if _, err := d.Client.CaptureReady(ctx, "bb", "runc"); corral.ErrorCode(err) != "invalid_argument" && corral.ErrorCode(err) != "failed_precondition" {
		t.Fatalf("capture on runc: %v", err)
	}
	out, errOut, code := d.corral("template", "capture", "bb", "--runtime", "gvisor")
	if code != 0 || !strings.Contains(out, "ready on gvisor") {
		t.Fatalf("corral template capture: %d %q %q", code, out, errOut)
	}
	tpl, err := d.Client.Template(ctx, "bb")
	if err != nil || tpl.ReadySnapshots["gvisor"] == "" {
		t.Fatalf("template after capture: %v %+v", err, tpl)
	}
	if list, _ := d.Client.List(ctx, corral.ListOptions{}); len(list) != 0 {
		t.Fatalf("capture left sandboxes: %+v", list)
	}
	if snaps, _ := d.Client.Snapshots(ctx); len(snaps) != 0 {
		t.Fatalf("ready snapshot listed: %+v", snaps)
	}

	warm := d.create(t, corral.CreateOptions{Runtime: "gvisor", Env: map[string]string{"MINE": "yes"}})
	host, _ := d.execOut(t, warm.ID, "hostname; echo $MINE")
	if strings.HasPrefix(host, warm.ID) || !strings.HasSuffix(host, "yes\n") {
		t.Fatalf("sandbox from the ready snapshot: hostname and env %q (own ID %s)", host, warm.ID)
	}
	cold := d.create(t, corral.CreateOptions{Runtime: "gvisor", MemoryMB: 300})
	if host, _ := d.execOut(t, cold.ID, "hostname"); host != cold.ID+"\n" {
		t.Fatalf("create with other limits: hostname %q, want its own ID %s", host, cold.ID)
	}
	for _, id := range []string{warm.ID, cold.ID} {
		if err := d.Client.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
	}

	if _, err := d.Client.CaptureReady(ctx, "bb", "gvisor"); err != nil {
		t.Fatal(err)
	}
	if got := readyDirs(t, d); len(got) != 1 {
		t.Fatalf("after a re-capture the snapshot directory holds %v", got)
	}
	if _, _, code := d.corral("template", "capture", "bb", "--runtime", "gvisor", "--drop"); code != 0 {
		t.Fatalf("corral template capture --drop: %d", code)
	}
	if got := readyDirs(t, d); len(got) != 0 {
		t.Fatalf("after a drop the snapshot directory holds %v", got)
	}

	// A template delete takes its ready snapshot with it.
	src := d.create(t, corral.CreateOptions{Runtime: "gvisor"})
	if _, err := d.Client.CreateSnapshot(ctx, src.ID, "files", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Client.TemplateFromSnapshot(ctx, "bb2", "files"); err != nil {
		t.Fatal(err)
	}
	if err := d.Client.Delete(ctx, src.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Client.CaptureReady(ctx, "bb2", "gvisor"); err != nil {
		t.Fatal(err)
	}
	dctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := d.Client.DeleteTemplate(dctx, "bb2"); err != nil {
		t.Fatal(err)
	}
	if got := readyDirs(t, d); len(got) != 0 {
		t.Fatalf("after the template's delete the snapshot directory holds %v", got)
	}
	if err := d.Client.DeleteSnapshot(ctx, "files"); err != nil {
		t.Fatal(err)
	}
	checkNoHalfSnapshots(t, d)
}

// BenchmarkReadyGVisor measures, alternating, a gVisor create of the bb
// template until its first exec answers: cold (gVisor boots) and from the
// template's ready snapshot (the capture's memory restored).
//
//	go test -run '^$' -bench ReadyGVisor -benchtime 5x ./test/e2e
func BenchmarkReadyGVisor(b *testing.B) {
	d := startGVisorDaemon(b)
	ctx := context.Background()
	if _, err := d.Client.CaptureReady(ctx, "bb", "gvisor"); err != nil {
		b.Fatal(err)
	}
	var cold, ready []time.Duration
	for b.Loop() {
		// Other limits than the capture's make a cold create.
		for _, c := range []struct {
			mem int64
			out *[]time.Duration
		}{{300, &cold}, {0, &ready}} {
			t0 := time.Now()
			sb, err := d.Client.Create(ctx, corral.CreateOptions{Template: "bb", Runtime: "gvisor", MemoryMB: c.mem})
			if err != nil {
				b.Fatal(err)
			}
			if out, _ := d.execOut(b, sb.ID, "echo hi"); out != "hi\n" {
				b.Fatalf("first exec: %q", out)
			}
			*c.out = append(*c.out, time.Since(t0))
			b.StopTimer()
			if err := d.Client.Delete(ctx, sb.ID); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
	}
	reportPercentiles(b, "cold-", cold)
	reportPercentiles(b, "ready-", ready)
}

// slowService takes about two seconds to become ready, as a real
// service's start-up does (an interpreter loading, a database recovering);
// it counts its starts in /tmp/starts.
const slowService = `{"shell": "echo start >> /tmp/starts; sleep 2; touch /tmp/ready; exec sleep 100000",
	"ready": {"shell": "test -f /tmp/ready", "interval_ms": 50}}`

// TestReadySnapshotWithService captures a template whose service is
// ready, and checks that a sandbox restored from the capture has the
// service running and ready without starting it again (one start, the
// capture's), while a cold create starts its own.
func TestReadySnapshotWithService(t *testing.T) {
	d := startGVisorDaemon(t)
	ctx := t.Context()
	d.serviceTemplate(t, "slow", slowService)
	if _, err := d.Client.CaptureReady(ctx, "slow", "gvisor"); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name string
		opts corral.CreateOptions
	}{
		{"restored", corral.CreateOptions{Template: "slow", Runtime: "gvisor"}},
		{"cold", corral.CreateOptions{Template: "slow", Runtime: "gvisor", MemoryMB: 300}},
	} {
		sb := d.create(t, tt.opts)
		out, _ := d.execOut(t, sb.ID, "cat /tmp/starts; test -f /tmp/ready && echo ready; hostname")
		if !strings.HasPrefix(out, "start\nready\n") {
			t.Errorf("%s sandbox: %q, want one start and the service ready", tt.name, out)
		}
		restored := !strings.HasSuffix(out, sb.ID+"\n")
		if restored != (tt.name == "restored") {
			t.Errorf("%s sandbox: hostname in %q says restored=%v", tt.name, out, restored)
		}
		st, err := d.Client.SandboxService(ctx, sb.ID)
		if err != nil || st.State != corral.ServiceReady {
			t.Errorf("%s sandbox service: %+v, %v", tt.name, st, err)
		}
		if err := d.Client.Delete(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
	}
}

// BenchmarkReadyServiceGVisor is BenchmarkReadyGVisor for a template
// whose service takes about two seconds to become ready (slowService):
// what a ready snapshot saves is the service's start-up.
//
//	go test -run '^$' -bench ReadyServiceGVisor -benchtime 5x ./test/e2e
func BenchmarkReadyServiceGVisor(b *testing.B) {
	d := startGVisorDaemon(b)
	ctx := context.Background()
	d.serviceTemplate(b, "slow", slowService)
	if _, err := d.Client.CaptureReady(ctx, "slow", "gvisor"); err != nil {
		b.Fatal(err)
	}
	var cold, ready []time.Duration
	for b.Loop() {
		for _, c := range []struct {
			mem int64
			out *[]time.Duration
		}{{300, &cold}, {0, &ready}} {
			t0 := time.Now()
			sb, err := d.Client.Create(ctx, corral.CreateOptions{Template: "slow", Runtime: "gvisor", MemoryMB: c.mem})
			if err != nil {
				b.Fatal(err)
			}
			if out, _ := d.execOut(b, sb.ID, "test -f /tmp/ready && echo ready"); out != "ready\n" {
				b.Fatalf("first exec: %q", out)
			}
			*c.out = append(*c.out, time.Since(t0))
			b.StopTimer()
			if err := d.Client.Delete(ctx, sb.ID); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
	}
	reportPercentiles(b, "cold-", cold)
	reportPercentiles(b, "ready-", ready)
}
