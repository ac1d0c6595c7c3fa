package interpreter

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// kernel is one running interpreter process of a context.
type kernel interface {
	// run executes code with env added to the process environment for
	// its duration and calls emit for its stdout, stderr, result and error
	// events, in order. When ctx ends first the kernel is interrupted
	// (SIGINT) and run waits for it to settle; a kernel that does not
	// settle within interruptGrace is killed. count is the execution
	// count, 0 when the language has none. An error means the kernel died
	// (errKernelDied) or could not be reached; an error in the user's
	// code is an error event, not an error.
	run(ctx context.Context, code string, env map[string]string, emit func(Event)) (count int, err error)
	// done is closed once the kernel process has exited.
	done() <-chan struct{}
	// kill ends the kernel's process group and waits for it.
	kill()
}

// interruptGrace is how long an interrupted kernel has to finish the
// execution before it is killed.
const interruptGrace = 5 * time.Second

// errKernelDied is returned by kernel.run when the process exited.
var errKernelDied = errors.New("the kernel died")

// kernelConfig is how a context starts its kernels.
type kernelConfig struct {
	language string
	cwd      string
	env      []string
	// dir is a private directory for connection files and cells.
	dir string
	// cred, if set, is the identity the kernel runs as.
	cred *syscall.Credential
	// tools names the interpreters' executables.
	tools Tools
}

// startKernel starts a kernel for cfg.language.
func startKernel(ctx context.Context, cfg kernelConfig) (kernel, error) {
	switch cfg.language {
	case LangPython:
		return startJupyter(ctx, cfg)
	case LangJavaScript:
		return startNode(ctx, cfg)
	case LangBash:
		return startBash(ctx, cfg)
	}
	return nil, fmt.Errorf("no kernel for language %q", cfg.language)
}

// proc is the process of a kernel: its own process group, its exit
// observed by one goroutine, and the tail of what it wrote to the
// descriptors the kernel does not use for output.
type proc struct {
	cmd    *exec.Cmd
	exited chan struct{}
	once   sync.Once
	log    *tailBuffer
	err    error // the exit status, set before exited is closed
}

// startProc starts cmd in a new process group as cfg's user, in cfg.cwd
// with cfg.env.
func startProc(cmd *exec.Cmd, cfg kernelConfig) (*proc, error) {
	cmd.Dir = cfg.cwd
	cmd.Env = cfg.env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: cfg.cred, Pdeathsig: syscall.SIGKILL}
	p := &proc{cmd: cmd, exited: make(chan struct{}), log: &tailBuffer{max: 4 << 10}}
	if cmd.Stdout == nil {
		cmd.Stdout = p.log
	}
	if cmd.Stderr == nil {
		cmd.Stderr = p.log
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		p.err = cmd.Wait()
		close(p.exited)
	}()
	return p, nil
}

func (p *proc) done() <-chan struct{} { return p.exited }

// signal sends sig to the kernel's process group.
func (p *proc) signal(sig syscall.Signal) {
	select {
	case <-p.exited:
	default:
		syscall.Kill(-p.cmd.Process.Pid, sig)
	}
}

func (p *proc) kill() {
	p.once.Do(func() {
		syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.exited
	})
}

// died describes the exit of the kernel for an error event.
func (p *proc) died() error {
	<-p.exited
	msg := "exited"
	if p.err != nil {
		msg = p.err.Error()
	}
	if tail := bytes.TrimSpace(p.log.bytes()); len(tail) > 0 {
		msg += "; its last output: " + string(tail)
	}
	return fmt.Errorf("%w (%s)", errKernelDied, msg)
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > t.max {
		t.b = append([]byte(nil), t.b[len(t.b)-t.max:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) bytes() []byte {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]byte(nil), t.b...)
}

// settle waits after an interrupt: it returns the channel that fires when
// the kernel has had interruptGrace to finish.
func settle() <-chan time.Time { return time.After(interruptGrace) }
