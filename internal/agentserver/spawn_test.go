package agentserver

import (
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corralrun/corral/internal/errdefs"
)

// TestProcessesStartOnlyThroughForkExec: under gVisor only the spawner's
// thread carries the seccomp filter, so a process started any other way
// would run unfiltered there. The agent's code may start processes only
// with the procTable's forkExec; syscall.ForkExec appears only as its
// default and in the spawner.
func TestProcessesStartOnlyThroughForkExec(t *testing.T) {
	allowed := map[string]bool{"proc.go": true, "spawner.go": true}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range f.Imports {
			if p, _ := strconv.Unquote(imp.Path.Value); p == "os/exec" {
				t.Errorf("%s imports os/exec", name)
			}
		}
		ast.Inspect(f, func(n ast.Node) bool {
			sel, ok := n.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			pkg, ok := sel.X.(*ast.Ident)
			if !ok {
				return true
			}
			switch pkg.Name + "." + sel.Sel.Name {
			case "os.StartProcess", "unix.ForkExec", "syscall.StartProcess", "syscall.Exec", "unix.Exec":
				t.Errorf("%s: %s.%s starts a process outside the spawner", fset.Position(sel.Pos()), pkg.Name, sel.Sel.Name)
			case "syscall.ForkExec":
				if !allowed[name] {
					t.Errorf("%s: syscall.ForkExec outside proc.go and spawner.go", fset.Position(sel.Pos()))
				}
			}
			return true
		})
	}
}

// TestSpawnerThreads: the first thread runs setup, and a start that finds
// every thread busy adds one that runs install first, up to
// maxSpawnThreads; every fork runs on a thread whose setup or install ran
// there. An added thread whose install fails serves nothing, stops the
// growth once it has failed, and is reported; starts still go through the
// others.
func TestSpawnerThreads(t *testing.T) {
	var mu sync.Mutex
	prepared := map[int]bool{} // thread IDs where setup or install ran
	prepare := func() error {
		mu.Lock()
		prepared[unix.Gettid()] = true
		mu.Unlock()
		return nil
	}
	release := make(chan struct{})
	forkedOn := make(chan int, 16)
	fork := func(string, []string, *syscall.ProcAttr) (int, error) {
		forkedOn <- unix.Gettid()
		<-release // busy until the test lets go
		return 1, nil
	}
	s := startSpawnerWith(prepare, prepare, nil, fork)
	defer s.stop()
	if err := s.wait(); err != nil {
		t.Fatal(err)
	}
	const starts = maxSpawnThreads + 2
	var wg sync.WaitGroup
	for range starts {
		wg.Go(func() {
			if pid, err := s.forkExec("/x", []string{"x"}, &syscall.ProcAttr{}); pid != 1 || err != nil {
				t.Errorf("forkExec = %d, %v", pid, err)
			}
		})
	}
	busy := map[int]bool{}
	for range maxSpawnThreads {
		busy[<-forkedOn] = true
	}
	select {
	case tid := <-forkedOn:
		t.Errorf("a start ran on thread %d while %d threads were busy", tid, maxSpawnThreads)
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	wg.Wait()
	close(forkedOn)
	for tid := range forkedOn {
		busy[tid] = true
	}
	mu.Lock()
	if len(busy) != maxSpawnThreads || len(prepared) != maxSpawnThreads {
		t.Errorf("starts ran on %d threads, %d prepared; want %d each", len(busy), len(prepared), maxSpawnThreads)
	}
	for tid := range busy {
		if !prepared[tid] {
			t.Errorf("a start ran on thread %d, where neither setup nor install ran", tid)
		}
	}
	mu.Unlock()

	// A failing install.
	var reported []error
	failed := func(err error) { mu.Lock(); reported = append(reported, err); mu.Unlock() }
	hold := make(chan struct{})
	s2 := startSpawnerWith(func() error { return nil }, func() error { return errors.New("no filter") }, failed,
		func(string, []string, *syscall.ProcAttr) (int, error) { <-hold; return 2, nil })
	defer s2.stop()
	var wg2 sync.WaitGroup
	for range 3 {
		wg2.Go(func() {
			if pid, err := s2.forkExec("/x", []string{"x"}, &syscall.ProcAttr{}); pid != 2 || err != nil {
				t.Errorf("forkExec = %d, %v", pid, err)
			}
		})
	}
	time.Sleep(50 * time.Millisecond)
	close(hold)
	wg2.Wait()
	s2.mu.Lock()
	n := s2.threads
	s2.mu.Unlock()
	mu.Lock()
	// Two starts may each add a thread before the first install fails.
	if len(reported) < 1 || len(reported) > 2 || n != maxSpawnThreads {
		t.Errorf("after a failed install: %d reports %v, threads %d (want 1 or 2 reports, growth stopped)", len(reported), reported, n)
	}
	mu.Unlock()

	// A failed setup fails every start, without an errno.
	s3 := startSpawnerWith(func() error { return syscall.ENOENT }, nil, nil, fork)
	if _, err := s3.forkExec("/x", []string{"x"}, &syscall.ProcAttr{}); !errors.Is(err, errdefs.ErrInternal) || errors.Is(err, syscall.ENOENT) {
		t.Errorf("start after a failed setup: %v", err)
	}
}
