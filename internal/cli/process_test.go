package cli

import (
	"errors"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	corral "github.com/corralrun/corral/sdk"
)

func TestSplitRemote(t *testing.T) {
	tests := []struct {
		arg, id, path string
		remote        bool
	}{
		{"abc:/work", "abc", "/work", true},
		{"abc:/", "abc", "/", true},
		{"./abc:/work", "", "./abc:/work", false},
		{"abc:work", "", "abc:work", false},
		{"/tmp/a:b", "", "/tmp/a:b", false},
		{":/work", "", ":/work", false},
		{"plain", "", "plain", false},
	}
	for _, tt := range tests {
		t.Run(tt.arg, func(t *testing.T) {
			id, p, remote := splitRemote(tt.arg)
			if id != tt.id || p != tt.path || remote != tt.remote {
				t.Fatalf("splitRemote(%q) = %q, %q, %v; want %q, %q, %v", tt.arg, id, p, remote, tt.id, tt.path, tt.remote)
			}
		})
	}
}

func TestProcessStatus(t *testing.T) {
	three := 3
	tests := []struct {
		name string
		p    corral.Process
		want string
	}{
		{"running", corral.Process{Running: true}, "running"},
		{"exited", corral.Process{ExitCode: &three}, "exited (3)"},
		{"killed", corral.Process{ExitCode: &three, Signal: "SIGKILL"}, "killed (SIGKILL)"},
		{"timed out", corral.Process{TimedOut: true, Signal: "SIGKILL"}, "timed out"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := processStatus(tt.p); got != tt.want {
				t.Fatalf("got %q, want %q", got, tt.want)
			}
		})
	}
}

func TestDetachInput(t *testing.T) {
	detached := false
	d := &detachInput{r: strings.NewReader("ls\x1dmore"), detach: func() { detached = true }}
	got, err := io.ReadAll(d)
	if !errors.Is(err, errInputCanceled) || string(got) != "ls" || !detached {
		t.Fatalf("read %q, %v, detached %v", got, err, detached)
	}
}

// TestCancelableInput: a Read blocked on a quiet descriptor returns as soon
// as the input is canceled, and data and EOF pass through before that.
func TestCancelableInput(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	in, err := newCancelableInput(r)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write([]byte("hi")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 10)
	if n, err := in.Read(buf); err != nil || string(buf[:n]) != "hi" {
		t.Fatalf("read %q, %v", buf[:n], err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := in.Read(buf)
		done <- err
	}()
	time.Sleep(20 * time.Millisecond)
	in.Close()
	select {
	case err := <-done:
		if !errors.Is(err, errInputCanceled) {
			t.Fatalf("canceled read returned %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("read did not return after Close")
	}
	if _, err := in.Read(buf); !errors.Is(err, errInputCanceled) {
		t.Fatalf("read after close returned %v", err)
	}

	r2, w2, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	in2, err := newCancelableInput(r2)
	if err != nil {
		t.Fatal(err)
	}
	defer in2.Close()
	w2.Close()
	if _, err := in2.Read(buf); err != io.EOF {
		t.Fatalf("read at end returned %v, want EOF", err)
	}
}
