package agentserver

import (
	"runtime"
	"sync"
	"syscall"

	"github.com/corralrun/corral/internal/errdefs"
)

// ForkExecFunc starts a process as syscall.ForkExec does.
type ForkExecFunc func(path string, argv []string, attr *syscall.ProcAttr) (pid int, err error)

// A spawner starts every process of the agent from OS threads of its
// own, each locked to its goroutine for the agent's lifetime. The first
// runs a setup function before it serves, every later one an install
// function: the agent's setup installs the sandbox's seccomp filter on
// that thread alone (seccomp.InstallThread) and writes the limits, the
// install only the filter. Every process inherits the filter from the
// thread that forked it, and the agent's other threads, which start
// nothing, carry none.
//
// Its own threads rather than all the agent's (SECCOMP_FILTER_FLAG_TSYNC)
// because of gVisor: it keeps, per task with a filter, a cache of the
// filter's answer for every system call number, built anew on the install
// for each thread and on every clone. With TSYNC every create would pay
// that build once for each of the agent's threads, and again for each
// thread the agent made afterwards; here it pays once per spawner thread.
//
// A start that finds every thread busy (a fork holds its thread until the
// child has exec'd) adds one, up to maxSpawnThreads, so that execs started
// at once do not queue behind a single fork.
//
// The setup runs while the agent builds its server; Main waits for its
// result before it reports ready, and every start waits for it too.
type spawner struct {
	reqs    chan spawnRequest
	done    chan struct{} // closed once setup has returned
	err     error         // setup's result; read only after done is closed
	install func() error
	failed  func(error)  // told when an added thread's install fails
	fork    ForkExecFunc // syscall.ForkExec but in tests

	mu      sync.Mutex
	threads int // serving or about to
}

// maxSpawnThreads bounds the spawner's threads.
const maxSpawnThreads = 4

type spawnRequest struct {
	path string
	argv []string
	attr *syscall.ProcAttr
	res  chan spawnResult
}

type spawnResult struct {
	pid int
	err error
}

// startSpawner starts the spawner's first thread and runs setup on it;
// threads added later run install. failed (may be nil) hears of an added
// thread whose install failed; it serves nothing, and once it has failed
// no more are added.
func startSpawner(setup, install func() error, failed func(error)) *spawner {
	return startSpawnerWith(setup, install, failed, syscall.ForkExec)
}

// startSpawnerWith is startSpawner with fork in place of syscall.ForkExec.
func startSpawnerWith(setup, install func() error, failed func(error), fork ForkExecFunc) *spawner {
	s := &spawner{reqs: make(chan spawnRequest), done: make(chan struct{}), install: install, failed: failed, fork: fork, threads: 1}
	go s.run(setup, func(err error) {
		s.err = err
		close(s.done)
	})
	return s
}

// run locks the calling goroutine to its thread, runs setup there, tells
// ready the result and, if setup succeeded, starts processes until the
// agent exits.
func (s *spawner) run(setup func() error, ready func(error)) {
	// Never unlocked: the thread is the one setup changed, and it must
	// not run other goroutines. After a failed setup the goroutine exits
	// locked, which ends its thread (or parks it, if it is the main one).
	runtime.LockOSThread()
	err := setup()
	ready(err)
	if err != nil {
		return
	}
	for r := range s.reqs {
		pid, err := s.fork(r.path, r.argv, r.attr)
		r.res <- spawnResult{pid, err}
	}
}

// grow adds a thread, unless there are maxSpawnThreads already.
func (s *spawner) grow() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.threads >= maxSpawnThreads {
		return
	}
	s.threads++
	go s.run(s.install, func(err error) {
		if err == nil {
			return
		}
		s.mu.Lock()
		s.threads = maxSpawnThreads
		s.mu.Unlock()
		if s.failed != nil {
			s.failed(err)
		}
	})
}

// wait returns setup's result once it has run.
func (s *spawner) wait() error {
	<-s.done
	return s.err
}

// forkExec is a ForkExecFunc that forks on one of the spawner's threads:
// an idle one, or when all are busy a new one or the first to be free.
func (s *spawner) forkExec(path string, argv []string, attr *syscall.ProcAttr) (int, error) {
	if err := s.wait(); err != nil {
		// Not the setup's errno, which a caller would take for the
		// child's.
		return 0, errorf(errdefs.ErrInternal, "starting processes: the agent's set-up failed: %v", err)
	}
	req := spawnRequest{path: path, argv: argv, attr: attr, res: make(chan spawnResult, 1)}
	select {
	case s.reqs <- req:
	default:
		s.grow()
		s.reqs <- req
	}
	r := <-req.res
	return r.pid, r.err
}

// stop ends the spawner's threads once they are idle; no start may come
// after it. The agent's spawner lives as long as the agent; tests stop
// theirs.
func (s *spawner) stop() { close(s.reqs) }
