package audit

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/corralrun/corral/internal/errdefs"
)

func open(t *testing.T, dir string, opts Options) *Log {
	t.Helper()
	l, err := Open(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// all returns the records of a query that does not follow.
func all(t *testing.T, l *Log, f Filter) []Record {
	t.Helper()
	var out []Record
	if err := l.Query(t.Context(), f, func(r Record) error { out = append(out, r); return nil }); err != nil {
		t.Fatal(err)
	}
	return out
}

// numbered is record i of a test: its action is "a<i>".
func numbered(i int) Record {
	return Record{Time: time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC).Add(time.Duration(i) * time.Second), Tenant: "t", Key: "k", Action: "a" + strconv.Itoa(i), SandboxID: "sb"}
}

// actions lists the actions of records.
func actions(rs []Record) []string {
	var out []string
	for _, r := range rs {
		out = append(out, r.Action)
	}
	return out
}

func appendN(t *testing.T, l *Log, from, to int) {
	t.Helper()
	for i := from; i < to; i++ {
		if err := l.Append(numbered(i)); err != nil {
			t.Fatal(err)
		}
	}
}

func wantActions(from, to int) []string {
	var out []string
	for i := from; i < to; i++ {
		out = append(out, "a"+strconv.Itoa(i))
	}
	return out
}

func TestAppendQueryRoundTrip(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "audit")
	l := open(t, dir, Options{})
	seven := 7
	local := time.FixedZone("UTC+2", 2*60*60)
	in := []Record{
		{Time: time.Date(2026, 1, 2, 5, 4, 5, 123456789, local), Tenant: "acme", Key: "ci", Action: "POST /v1/sandboxes",
			SandboxID: "sb1", Status: 201, DurationMS: 12.5, Detail: map[string]string{"template": "default"}},
		{Time: time.Date(2026, 1, 2, 3, 4, 6, 0, time.UTC), Tenant: "acme", Key: "ci", Action: "exec", SandboxID: "sb1",
			Argv: []string{"sh", "-c", "exit 7"}, ExitCode: &seven, DurationMS: 3},
		{Time: time.Date(2026, 1, 2, 3, 4, 7, 0, time.UTC), Tenant: "acme", Key: "ci", Action: "code", SandboxID: "sb1",
			CodeSHA256: strings.Repeat("ab", 32), Signal: "SIGKILL", Error: "killed"},
	}
	for _, r := range in {
		if err := l.Append(r); err != nil {
			t.Fatal(err)
		}
	}
	want := append([]Record(nil), in...)
	want[0].Time = want[0].Time.UTC()
	if diff := cmp.Diff(want, all(t, l, Filter{})); diff != "" {
		t.Errorf("records (-want +got):\n%s", diff)
	}

	data, err := os.ReadFile(filepath.Join(dir, FileName))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], `{"time":"2026-01-02T03:04:05.123456789Z","tenant":"acme","key":"ci","action":"POST /v1/sandboxes","sandbox_id":"sb1","status":201,`) {
		t.Errorf("file:\n%s", data)
	}
	for path, want := range map[string]os.FileMode{dir: 0o700 | os.ModeDir, filepath.Join(dir, FileName): 0o600} {
		if fi, err := os.Stat(path); err != nil || fi.Mode() != want {
			t.Errorf("%s: mode %v, %v; want %v", path, fi.Mode(), err, want)
		}
	}

	before := time.Now()
	if err := l.Append(Record{Action: "DELETE /v1/sandboxes/sb1"}); err != nil {
		t.Fatal(err)
	}
	got := all(t, l, Filter{})
	if last := got[len(got)-1].Time; last.Before(before) || last.Location() != time.UTC {
		t.Errorf("a record without a time got %v, want now in UTC", last)
	}
}

func TestFilter(t *testing.T) {
	l := open(t, t.TempDir(), Options{})
	at := func(sec int) time.Time { return time.Date(2026, 1, 2, 3, 4, sec, 0, time.UTC) }
	for _, r := range []Record{
		{Time: at(1), Tenant: "acme", Key: "ci", SandboxID: "sb1", Action: "a1"},
		{Time: at(2), Tenant: "acme", Key: "dev", SandboxID: "sb2", Action: "a2"},
		{Time: at(3), Tenant: "beta", Key: "ci", SandboxID: "sb3", Action: "a3"},
		{Time: at(4), Tenant: "acme", Key: "ci", SandboxID: "sb2", Action: "a4"},
	} {
		if err := l.Append(r); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		name string
		f    Filter
		want []string
	}{
		{"everything", Filter{}, []string{"a1", "a2", "a3", "a4"}},
		{"sandbox", Filter{SandboxID: "sb2"}, []string{"a2", "a4"}},
		{"key", Filter{Key: "ci"}, []string{"a1", "a3", "a4"}},
		{"tenant", Filter{Tenant: "acme"}, []string{"a1", "a2", "a4"}},
		{"key and tenant", Filter{Tenant: "acme", Key: "ci"}, []string{"a1", "a4"}},
		{"since is inclusive", Filter{Since: at(3)}, []string{"a3", "a4"}},
		{"until is exclusive", Filter{Until: at(3)}, []string{"a1", "a2"}},
		{"since and until", Filter{Since: at(2), Until: at(4)}, []string{"a2", "a3"}},
		{"nothing", Filter{SandboxID: "sb9"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, actions(all(t, l, tt.f))); diff != "" {
				t.Errorf("actions (-want +got):\n%s", diff)
			}
		})
	}
}

// lineLen is the length of the line of numbered(i) for one-digit i; it is
// one more for two digits.
func lineLen(t *testing.T) int64 {
	t.Helper()
	dir := t.TempDir()
	l := open(t, dir, Options{})
	appendN(t, l, 0, 1)
	fi, err := os.Stat(filepath.Join(dir, FileName))
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

func TestRotation(t *testing.T) {
	dir := t.TempDir()
	max := 3*lineLen(t) + 10 // three records of a<i> with i < 100 per file
	l := open(t, dir, Options{MaxBytes: max, Keep: 2})
	appendN(t, l, 0, 20)

	names, err := filepath.Glob(filepath.Join(dir, "*"))
	if err != nil {
		t.Fatal(err)
	}
	var base []string
	for _, n := range names {
		base = append(base, filepath.Base(n))
		if fi, err := os.Stat(n); err != nil || fi.Size() > max || fi.Mode() != 0o600 {
			t.Errorf("%s: %v, %v", n, fi.Size(), err)
		}
	}
	if diff := cmp.Diff([]string{"audit.log", "audit.log.1", "audit.log.2"}, base); diff != "" {
		t.Errorf("files (-want +got):\n%s", diff)
	}
	// 20 records, three a file: 18 in six full files, the newest two of
	// them kept, and two in the current one.
	if diff := cmp.Diff(wantActions(12, 20), actions(all(t, l, Filter{}))); diff != "" {
		t.Errorf("actions (-want +got):\n%s", diff)
	}

	// A record longer than MaxBytes gets a file of its own.
	big := numbered(20)
	big.Argv = []string{strings.Repeat("x", int(max))}
	if err := l.Append(big); err != nil {
		t.Fatal(err)
	}
	appendN(t, l, 21, 22)
	if diff := cmp.Diff(wantActions(18, 22), actions(all(t, l, Filter{}))); diff != "" {
		t.Errorf("actions after a big record (-want +got):\n%s", diff)
	}
}

// A query with Since passes over rotated files last written before it.
func TestSinceSkipsOldFiles(t *testing.T) {
	dir := t.TempDir()
	l := open(t, dir, Options{MaxBytes: 1, Keep: 4}) // a file per record
	since := time.Now().Add(-time.Minute)
	for i := range 3 {
		if err := l.Append(Record{Action: "a" + strconv.Itoa(i)}); err != nil { // at the current time
			t.Fatal(err)
		}
	}
	old := time.Now().Add(-time.Hour)
	if err := os.Chtimes(filepath.Join(dir, FileName+".2"), old, old); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"a1", "a2"}, actions(all(t, l, Filter{Since: since}))); diff != "" {
		t.Errorf("actions (-want +got):\n%s", diff)
	}
}

func TestReopenContinues(t *testing.T) {
	dir := t.TempDir()
	l, err := Open(dir, Options{Keep: 2})
	if err != nil {
		t.Fatal(err)
	}
	appendN(t, l, 0, 2)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	// A file a run with a larger Keep left.
	if err := os.WriteFile(filepath.Join(dir, FileName+".3"), []byte("{}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	l = open(t, dir, Options{Keep: 2})
	appendN(t, l, 2, 3)
	if diff := cmp.Diff(wantActions(0, 3), actions(all(t, l, Filter{}))); diff != "" {
		t.Errorf("actions (-want +got):\n%s", diff)
	}
	if _, err := os.Stat(filepath.Join(dir, FileName+".3")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("audit.log.3 beyond Keep: %v", err)
	}
}

// failAfter makes the log's writes write the first cut(len) bytes and fail
// with ENOSPC, as a write on a full disk does.
func failAfter(l *Log, cut func(n int) int) {
	l.write = func(f *os.File, p []byte) (int, error) {
		n, err := f.Write(p[:cut(len(p))])
		if err != nil {
			return n, err
		}
		return n, &os.PathError{Op: "write", Path: f.Name(), Err: syscall.ENOSPC}
	}
}

// A failed write makes Append say so, and leaves a file whose whole
// records read, whether the log goes on or is opened again.
func TestFailedWrite(t *testing.T) {
	tests := []struct {
		name   string
		cut    func(n int) int
		reopen bool
	}{
		{"nothing written", func(int) int { return 0 }, false},
		{"one byte", func(int) int { return 1 }, false},
		{"half", func(n int) int { return n / 2 }, false},
		{"all but the newline", func(n int) int { return n - 1 }, false},
		{"all but the newline, then reopened", func(n int) int { return n - 1 }, true},
		{"half, then reopened", func(n int) int { return n / 2 }, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			l := open(t, dir, Options{})
			appendN(t, l, 0, 1)
			failAfter(l, tt.cut)
			err := l.Append(numbered(1))
			if !errors.Is(err, syscall.ENOSPC) || !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "disk full") {
				t.Fatalf("Append on a full disk: %v", err)
			}
			if diff := cmp.Diff(wantActions(0, 1), actions(all(t, l, Filter{}))); diff != "" {
				t.Errorf("actions after the failure (-want +got):\n%s", diff)
			}
			if tt.reopen {
				l.Close()
				l = open(t, dir, Options{})
			}
			l.write = (*os.File).Write
			appendN(t, l, 2, 4)
			if diff := cmp.Diff([]string{"a0", "a2", "a3"}, actions(all(t, l, Filter{}))); diff != "" {
				t.Errorf("actions (-want +got):\n%s", diff)
			}
			wantSkipped := int64(1)
			if tt.cut(10) == 0 {
				wantSkipped = 0
			}
			if got := l.Skipped(); got != wantSkipped {
				t.Errorf("Skipped = %d, want %d", got, wantSkipped)
			}
		})
	}
}

// A failed write's fragment at the end of a file that rotates is skipped.
func TestFailedWriteBeforeRotation(t *testing.T) {
	dir := t.TempDir()
	l := open(t, dir, Options{MaxBytes: 2*lineLen(t) + 5})
	appendN(t, l, 0, 1)
	failAfter(l, func(n int) int { return n - 1 })
	if err := l.Append(numbered(1)); err == nil {
		t.Fatal("Append did not fail")
	}
	l.write = (*os.File).Write
	appendN(t, l, 2, 4) // a2 rotates
	if _, err := os.Stat(filepath.Join(dir, FileName+".1")); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"a0", "a2", "a3"}, actions(all(t, l, Filter{}))); diff != "" {
		t.Errorf("actions (-want +got):\n%s", diff)
	}
	if got := l.Skipped(); got != 1 {
		t.Errorf("Skipped = %d, want 1", got)
	}
}

// follow runs a following query in the background and returns its
// records as they come, and its end.
func follow(ctx context.Context, l *Log, f Filter) (<-chan Record, <-chan error) {
	recs := make(chan Record, 1000)
	done := make(chan error, 1)
	f.Follow = true
	go func() {
		done <- l.Query(ctx, f, func(r Record) error { recs <- r; return nil })
	}()
	return recs, done
}

// receive waits for n records.
func receive(t *testing.T, recs <-chan Record, n int) []string {
	t.Helper()
	var got []string
	for len(got) < n {
		select {
		case r := <-recs:
			got = append(got, r.Action)
		case <-time.After(10 * time.Second):
			t.Fatalf("received %d records of %d: %v", len(got), n, got)
		}
	}
	return got
}

func TestFollow(t *testing.T) {
	l := open(t, t.TempDir(), Options{MaxBytes: 2*lineLen(t) + 5, Keep: 100})
	appendN(t, l, 0, 5)
	ctx, cancel := context.WithCancel(t.Context())
	recs, done := follow(ctx, l, Filter{SandboxID: "sb"})
	if diff := cmp.Diff(wantActions(0, 5), receive(t, recs, 5)); diff != "" {
		t.Errorf("existing records (-want +got):\n%s", diff)
	}
	if err := l.Append(Record{Action: "other sandbox", SandboxID: "sb2"}); err != nil {
		t.Fatal(err)
	}
	appendN(t, l, 5, 50) // rotating every other record
	if diff := cmp.Diff(wantActions(5, 50), receive(t, recs, 45)); diff != "" {
		t.Errorf("appended records (-want +got):\n%s", diff)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("Query ended with %v, want context.Canceled", err)
	}
	if len(recs) > 0 {
		t.Errorf("%d records more than appended", len(recs))
	}
}

// Close ends a follower once it has delivered every record.
func TestFollowEndsAtClose(t *testing.T) {
	l := open(t, t.TempDir(), Options{})
	appendN(t, l, 0, 1)
	recs, done := follow(t.Context(), l, Filter{})
	receive(t, recs, 1)
	appendN(t, l, 1, 3)
	l.Close()
	if err := <-done; !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("Query ended with %v, want ErrUnavailable", err)
	}
	if diff := cmp.Diff(wantActions(1, 3), receive(t, recs, 2)); diff != "" {
		t.Errorf("records after the first (-want +got):\n%s", diff)
	}
}

// A follower that falls more than Keep rotations behind is told so.
func TestFollowerFallsBehind(t *testing.T) {
	l := open(t, t.TempDir(), Options{MaxBytes: 1, Keep: 1}) // a file per record
	appendN(t, l, 0, 1)
	started, release := make(chan struct{}), make(chan struct{})
	var got []string
	done := make(chan error, 1)
	go func() {
		done <- l.Query(t.Context(), Filter{Follow: true}, func(r Record) error {
			if r.Action == "a0" {
				close(started)
				<-release
			}
			got = append(got, r.Action)
			return nil
		})
	}()
	<-started
	appendN(t, l, 1, 5) // a1 and a2 are gone before the follower reads them
	close(release)
	err := <-done
	if !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("Query ended with %v, want ErrResourceExhausted", err)
	}
	if diff := cmp.Diff([]string{"a0"}, got); diff != "" {
		t.Errorf("records (-want +got):\n%s", diff)
	}
}

// Concurrent appends, rotating, write whole lines that a concurrent
// follower reads exactly once each.
func TestConcurrentAppends(t *testing.T) {
	const writers, each = 8, 100
	dir := t.TempDir()
	l := open(t, dir, Options{MaxBytes: 4 << 10, Keep: 100})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	recs, done := follow(ctx, l, Filter{})
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				r := Record{Action: fmt.Sprintf("w%d-%d", w, i), Argv: []string{strings.Repeat("x", i)}}
				if err := l.Append(r); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Go(func() { // a reader that does not follow, meanwhile
		for range 20 {
			if err := l.Query(ctx, Filter{}, func(Record) error { return nil }); err != nil {
				t.Error(err)
			}
		}
	})
	wg.Wait()

	seen := map[string]int{}
	for _, a := range receive(t, recs, writers*each) {
		seen[a]++
	}
	for _, a := range actions(all(t, l, Filter{})) {
		seen[a] += 10
	}
	for w := range writers {
		for i := range each {
			if a := fmt.Sprintf("w%d-%d", w, i); seen[a] != 11 {
				t.Errorf("%s: followed %d times, queried %d times", a, seen[a]%10, seen[a]/10)
			}
		}
	}
	if l.Skipped() != 0 {
		t.Errorf("Skipped = %d", l.Skipped())
	}
	cancel()
	<-done

	files, _ := filepath.Glob(filepath.Join(dir, FileName+"*"))
	lines := 0
	for _, name := range files {
		data, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(bytes.NewReader(data))
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			lines++
			if !bytes.HasPrefix(sc.Bytes(), []byte(`{"time":`)) || !bytes.HasSuffix(sc.Bytes(), []byte("}")) {
				t.Errorf("%s: line %q", name, sc.Bytes())
			}
		}
	}
	if lines != writers*each {
		t.Errorf("%d lines in %d files, want %d", lines, len(files), writers*each)
	}
}

func TestClosed(t *testing.T) {
	l, err := Open(t.TempDir(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if err := l.Append(numbered(0)); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("Append after Close: %v", err)
	}
	if err := l.Query(t.Context(), Filter{}, func(Record) error { return nil }); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("Query after Close: %v", err)
	}
}

func TestAppendRefusesWhatDoesNotEncode(t *testing.T) {
	l := open(t, t.TempDir(), Options{})
	if err := l.Append(Record{Action: "exec", DurationMS: math.NaN()}); !errors.Is(err, errdefs.ErrInternal) {
		t.Errorf("Append with a NaN duration: %v", err)
	}
	if got := all(t, l, Filter{}); len(got) != 0 {
		t.Errorf("records %v", got)
	}
}

func TestOpenRefusesNegativeOptions(t *testing.T) {
	for _, opts := range []Options{{MaxBytes: -1}, {Keep: -1}} {
		if _, err := Open(t.TempDir(), opts); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("Open with %+v: %v", opts, err)
		}
	}
}

// The error of fn ends a query and is what it returns.
func TestQueryStopsAtFnError(t *testing.T) {
	l := open(t, t.TempDir(), Options{})
	appendN(t, l, 0, 3)
	stop := errors.New("stop")
	n := 0
	err := l.Query(t.Context(), Filter{}, func(Record) error { n++; return stop })
	if err != stop || n != 1 {
		t.Errorf("Query = %v after %d records", err, n)
	}
}
