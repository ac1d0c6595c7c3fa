package ocirt

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/corralrun/corral/internal/errdefs"
)

// CLI runs one OCI runtime binary with a fixed state root and global
// flags. The zero value is not usable; it is safe for concurrent use.
type CLI struct {
	// Name is how errors name the runtime ("runc", "runsc").
	Name string
	// Path is the runtime binary.
	Path string
	// Root is the runtime's state directory (--root).
	Root string
	// Flags are global flags put before every subcommand, after --root.
	Flags []string
	// Sealed, when set, is a sealed copy of Path that commands run
	// instead. They run Path itself when the copy cannot be renewed.
	Sealed *Sealed
}

// Command returns the command for one runtime invocation with the
// runtime's environment (Env) and a one-second WaitDelay; the caller sets
// its standard I/O and runs it.
func (c CLI) Command(ctx context.Context, args ...string) *exec.Cmd {
	argv := append([]string{"--root", c.Root}, c.Flags...)
	path := c.Path
	if c.Sealed != nil {
		if p, err := c.Sealed.Path(); err == nil {
			path = p
		}
	}
	cmd := exec.CommandContext(ctx, path, append(argv, args...)...)
	cmd.Args[0] = c.Path
	cmd.Env = Env()
	cmd.WaitDelay = time.Second
	return cmd
}

// Run runs one command, with stdin when not nil, and returns its standard
// output. A failure is an *Error carrying the runtime's message.
func (c CLI) Run(ctx context.Context, stdin []byte, args ...string) ([]byte, error) {
	cmd := c.Command(ctx, args...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout = &stdout
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		// runsc reports some failures on stdout ("ERROR: ...").
		msg := Message(stderr.String())
		if msg == "" {
			msg = strings.TrimSpace(stdout.String())
		}
		return nil, &Error{Runtime: c.Name, Args: args, Msg: msg, Err: err}
	}
	return stdout.Bytes(), nil
}

// Env is the environment a runtime runs with: enough to find its helpers,
// and nothing that changes its behaviour (LISTEN_FDS adds inherited fds,
// NOTIFY_SOCKET turns on sd_notify handling).
func Env() []string {
	return []string{"PATH=" + os.Getenv("PATH")}
}

// Error is a failed runtime invocation with the runtime's own message.
type Error struct {
	Runtime string
	Args    []string
	Msg     string
	Err     error
}

func (e *Error) Error() string {
	verb := ""
	if len(e.Args) > 0 {
		verb = " " + e.Args[0]
	}
	if e.Msg == "" {
		return fmt.Sprintf("%s%s: %v", e.Runtime, verb, e.Err)
	}
	return fmt.Sprintf("%s%s: %s", e.Runtime, verb, e.Msg)
}

func (e *Error) Unwrap() error { return e.Err }

// Message extracts the msg="..." fields of logrus lines (runc's error
// output), falling back to the trimmed output (runsc's).
func Message(out string) string {
	out = strings.TrimSpace(out)
	var msgs []string
	for _, line := range strings.Split(out, "\n") {
		_, rest, ok := strings.Cut(line, `msg="`)
		if !ok {
			continue
		}
		if s, err := strconv.Unquote(`"` + strings.TrimSuffix(rest, `"`) + `"`); err == nil {
			rest = s
		}
		msgs = append(msgs, rest)
	}
	if len(msgs) == 0 {
		return out
	}
	return strings.Join(msgs, "; ")
}

// IsNotExist reports whether err is the runtime saying it does not know
// the container: runc's "container does not exist", runsc's "loading
// container: file does not exist".
func IsNotExist(err error) bool {
	var re *Error
	return errors.As(err, &re) && strings.Contains(re.Msg, "does not exist")
}

// Classify adds the errdefs kind that matches the runtime's message.
func Classify(err error) error {
	var re *Error
	if !errors.As(err, &re) {
		return err
	}
	switch {
	case strings.Contains(re.Msg, "does not exist"):
		return fmt.Errorf("%w: %w", errdefs.ErrNotFound, err)
	case strings.Contains(re.Msg, "not running"), strings.Contains(re.Msg, "not paused"),
		strings.Contains(re.Msg, "is paused"), strings.Contains(re.Msg, "stopped"),
		strings.Contains(re.Msg, " in state "): // runsc: cannot pause container "x" in state paused
		return fmt.Errorf("%w: %w", errdefs.ErrFailedPrecondition, err)
	}
	return err
}
