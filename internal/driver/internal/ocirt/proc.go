package ocirt

import (
	"bytes"
	"context"
	"io"
	"os"
	"strconv"
	"strings"
	"time"
)

// ReadPid reads a pid file as runtimes write it (--pid-file).
func ReadPid(name string) (int, error) {
	b, err := os.ReadFile(name)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}

// WaitExited polls until pid is gone or a zombie, for at most limit.
func WaitExited(ctx context.Context, pid int, limit time.Duration) {
	waitProc(ctx, pid, limit, true)
}

// WaitGone polls until pid is gone (reaped), for at most limit.
func WaitGone(ctx context.Context, pid int, limit time.Duration) {
	waitProc(ctx, pid, limit, false)
}

func waitProc(ctx context.Context, pid int, limit time.Duration, zombieIsGone bool) {
	deadline := time.Now().Add(limit)
	delay := 500 * time.Microsecond
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if zombieIsGone && Exited(pid) || !zombieIsGone && ProcState(pid) == 0 {
			return
		}
		time.Sleep(delay)
		delay = min(2*delay, 20*time.Millisecond)
	}
}

// Exited reports whether process pid is gone or a zombie: it runs no
// more, whether or not it has been reaped.
func Exited(pid int) bool {
	st := ProcState(pid)
	return st == 0 || st == 'Z' || st == 'X'
}

// ProcState returns the state letter of process pid from /proc ('R', 'S',
// 'Z', ...), or 0 when there is no such process.
func ProcState(pid int) byte {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	// Format: "pid (comm) S ...": the state follows the last ')'.
	if i := bytes.LastIndexByte(b, ')'); i >= 0 && i+2 < len(b) {
		return b[i+2]
	}
	return 0
}

// ParentPid returns the parent of process pid, or 0 when unknown.
func ParentPid(pid int) int {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 2 {
		return 0
	}
	ppid, _ := strconv.Atoi(f[1])
	return ppid
}

// ReadTail returns up to n bytes from the end of a file, "" if unreadable.
func ReadTail(name string, n int64) string {
	f, err := os.Open(name)
	if err != nil {
		return ""
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return ""
	}
	off := max(st.Size()-n, 0)
	b := make([]byte, st.Size()-off)
	if _, err := f.ReadAt(b, off); err != nil && err != io.EOF {
		return ""
	}
	return strings.TrimSpace(string(b))
}
