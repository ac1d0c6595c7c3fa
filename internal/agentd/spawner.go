package agentd

import (
	"runtime"
	"syscall"

	"github.com/corralrun/corral/internal/errdefs"
)

// ForkExecFunc starts a process as syscall.ForkExec does.
type ForkExecFunc func(path string, argv []string, attr *syscall.ProcAttr) (pid int, err error)

// A spawner starts every process of the agent from one OS thread, locked
// to it for the agent's lifetime, after running a setup function there.
// The agent's setup installs the sandbox's seccomp filter on that thread
// alone (seccomp.InstallThread): every process it starts inherits the
// filter from the thread that forked it, and the agent's other threads,
// which start nothing, carry none.
//
// One thread rather than all of them (SECCOMP_FILTER_FLAG_TSYNC) because
// of gVisor: it keeps, per task with a filter, a cache of the filter's
// answer for every system call number, built anew on the install for each
// thread and on every clone. With TSYNC the install took 10.6 ms of each
// gVisor create (the agent has five threads by then) against 4.5 ms on one
// thread, and each thread the agent made afterwards paid another build.
//
// The setup runs while the agent builds its server; Main waits for its
// result before it reports ready, and every start waits for it too.
type spawner struct {
	reqs chan spawnRequest
	done chan struct{} // closed once setup has returned
	err  error         // setup's result; read only after done is closed
}

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

// startSpawner starts the spawner's thread and runs setup on it.
func startSpawner(setup func() error) *spawner {
	s := &spawner{reqs: make(chan spawnRequest), done: make(chan struct{})}
	go s.run(setup)
	return s
}

func (s *spawner) run(setup func() error) {
	// Never unlocked: the thread is the one setup changed, and it must
	// not run other goroutines. After a failed setup the goroutine exits
	// locked, which ends its thread (or parks it, if it is the main one);
	// the agent exits then anyway.
	runtime.LockOSThread()
	s.err = setup()
	close(s.done)
	if s.err != nil {
		return
	}
	for r := range s.reqs {
		pid, err := syscall.ForkExec(r.path, r.argv, r.attr)
		r.res <- spawnResult{pid, err}
	}
}

// wait returns setup's result once it has run.
func (s *spawner) wait() error {
	<-s.done
	return s.err
}

// forkExec is a ForkExecFunc that forks on the spawner's thread.
func (s *spawner) forkExec(path string, argv []string, attr *syscall.ProcAttr) (int, error) {
	if err := s.wait(); err != nil {
		// Not the setup's errno, which a caller would take for the
		// child's.
		return 0, errorf(errdefs.ErrInternal, "starting processes: the agent's set-up failed: %v", err)
	}
	res := make(chan spawnResult, 1)
	s.reqs <- spawnRequest{path: path, argv: argv, attr: attr, res: res}
	r := <-res
	return r.pid, r.err
}
