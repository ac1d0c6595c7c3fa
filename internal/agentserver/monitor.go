package agentserver

import (
	"errors"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// monitor owns p from start to finish: it runs the output pumps, collects
// the exit status, bounds the output drain, and finally publishes the exit
// and files p in the table. fed, when not nil, is closed by the stdin
// feeder once it is done.
func (t *procTable) monitor(p *process, fed chan struct{}) {
	defer t.wg.Done()

	pumped := make(chan struct{}, len(p.outputs))
	for _, o := range p.outputs {
		go t.pump(p, o, pumped)
	}

	ws, ok := t.wait(p)
	p.mu.Lock()
	p.reaped = true
	if p.timer != nil {
		p.timer.Stop()
	}
	p.exit = exitStatusOf(ws, ok, p.timedOut)
	p.exitedAt = time.Now().UTC()
	p.mu.Unlock()
	if !ok {
		t.log.Error("exit status lost", "pid", p.pid)
	}

	// Output normally ends with the process (a terminal's master reads
	// EIO once the last holder of the tty is gone). Grandchildren that
	// inherited the pipes or the tty get drainTimeout; then the pumps take
	// what is buffered, which includes everything the process itself
	// wrote, and stop.
	deadline := time.Now().Add(drainTimeout)
	for _, o := range p.outputs {
		if err := o.f.SetReadDeadline(deadline); err != nil {
			// Not pollable (never for os.Pipe or /dev/ptmx): cut it off
			// instead.
			time.AfterFunc(drainTimeout, func() { o.f.Close() })
		}
	}
	for range p.outputs {
		<-pumped
	}
	if p.stdin != nil {
		p.stdin.shut() // unblocks a feeder or writer that nobody reads from
	}
	for _, o := range p.outputs {
		o.f.Close()
	}
	if fed != nil {
		<-fed
	}
	if p.out != nil {
		p.out.close()
	}
	t.file(p)
	close(p.done)
	if p.sub != nil {
		close(p.sub.ch)
	}
}

// wait returns the exit status of p, or false when it cannot be known.
func (t *procTable) wait(p *process) (syscall.WaitStatus, bool) {
	if t.reaper != nil {
		return <-p.status, true
	}
	for {
		var ws syscall.WaitStatus
		_, err := syscall.Wait4(p.pid, &ws, 0, nil)
		if err == syscall.EINTR {
			continue
		}
		return ws, err == nil
	}
}

func exitStatusOf(ws syscall.WaitStatus, ok, timedOut bool) exitStatus {
	switch {
	case !ok:
		return exitStatus{lost: true, timedOut: timedOut}
	case ws.Signaled():
		return exitStatus{code: 128 + int(ws.Signal()), signal: unix.SignalName(ws.Signal()), timedOut: timedOut}
	default:
		return exitStatus{code: ws.ExitStatus(), timedOut: timedOut}
	}
}

// pump copies one output stream of p to its subscriber or log until EOF,
// or until the read deadline the monitor sets after exit has passed and
// the data still buffered is passed on.
func (t *procTable) pump(p *process, o output, done chan<- struct{}) {
	defer func() { done <- struct{}{} }()
	bp := t.bufs.Get().(*[]byte)
	defer t.bufs.Put(bp)
	buf := *bp
	for {
		n, err := o.f.Read(buf)
		if n > 0 {
			p.publish(o.id, buf[:n])
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			drainBuffered(o.f, buf, func(b []byte) { p.publish(o.id, b) })
			return
		}
		if err != nil {
			return // EOF, or EIO from a terminal whose tty is closed
		}
	}
}

// drainBuffered passes on what the pipe f holds right now, without
// waiting for more: a slow reader must not lose output that the process
// wrote before it exited, and a grandchild that keeps writing must not
// keep the stream open.
func drainBuffered(f *os.File, buf []byte, emit func([]byte)) {
	rc, err := f.SyscallConn()
	if err != nil || f.SetReadDeadline(time.Time{}) != nil {
		return
	}
	var pending int // TIOCINQ is FIONREAD: bytes waiting in the pipe
	if rc.Control(func(fd uintptr) { pending, err = unix.IoctlGetInt(int(fd), unix.TIOCINQ) }) != nil || err != nil {
		return
	}
	for pending > 0 {
		var n int
		// The fd is non-blocking: a read of an empty pipe fails with
		// EAGAIN instead of waiting, and returning true never waits.
		if rc.Read(func(fd uintptr) bool { n, err = unix.Read(int(fd), buf[:min(len(buf), pending)]); return true }) != nil || err != nil || n <= 0 {
			return
		}
		emit(buf[:n])
		pending -= n
	}
}

// publish passes data on. A background process appends it to its log,
// which never waits. A foreground process hands a copy to its subscriber
// and waits until it is taken (or the subscriber is gone): output is
// backpressured to the process through the pipe rather than buffered
// here.
func (p *process) publish(id streamID, data []byte) {
	if p.out != nil {
		p.out.write(id, data)
		return
	}
	p.written.Add(int64(len(data)))
	c := chunk{stream: id, data: append([]byte(nil), data...)}
	select {
	case p.sub.ch <- c:
	case <-p.sub.gone:
	}
}
