package interpreter

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// setupPy is run silently in every Python kernel once it answers: it
// turns off traceback colours and adds the formatters for data frames and
// matplotlib charts (mimeData, mimeChart).
//
//go:embed setup.py
var setupPy string

// jupyterKernel is an IPython kernel (ipykernel) spoken to with the
// Jupyter messaging protocol, version 5.3: execute requests on the shell
// socket (DEALER to the kernel's ROUTER), outputs on the IOPub socket (SUB
// to its PUB). Interrupts are SIGINT, the kernel's default interrupt mode;
// the control, stdin and heartbeat sockets are not used, since the process
// is the service's own child and its exit is seen directly.
type jupyterKernel struct {
	*proc
	key     []byte
	session string
	shell   *zconn
	iopub   *zconn
	// shellIn and iopubIn carry the messages their reader goroutines
	// received; each reader ends when its connection closes (kill).
	shellIn, iopubIn chan *jmsg
}

// jmsg is a received Jupyter message, the parts this package reads.
type jmsg struct {
	Header struct {
		MsgID   string `json:"msg_id"`
		MsgType string `json:"msg_type"`
	}
	Parent struct {
		MsgID string `json:"msg_id"`
	}
	Content json.RawMessage
}

// connInfo is the connection file ipykernel writes once it has bound its
// sockets.
type connInfo struct {
	IP        string `json:"ip"`
	Transport string `json:"transport"`
	ShellPort int    `json:"shell_port"`
	IOPubPort int    `json:"iopub_port"`
	Key       string `json:"key"`
	Scheme    string `json:"signature_scheme"`
}

// idleAfterReply is how long an execution waits for the kernel's idle
// status after its reply and its last output. It is long because one
// IOPub message may carry tens of megabytes of output, which take seconds
// to arrive and decode on a loaded machine.
const idleAfterReply = 30 * time.Second

// kernelStartTimeout bounds the start of a kernel process up to its first
// answer.
const kernelStartTimeout = 60 * time.Second

// startJupyter starts `python3 -m ipykernel_launcher` with a connection
// file that does not exist yet, so that the kernel picks free ports and a
// key and writes them there (no race for ports with other processes), then
// connects and waits for the kernel to answer a kernel_info request on
// both sockets.
func startJupyter(ctx context.Context, cfg kernelConfig) (_ kernel, err error) {
	ctx, cancel := context.WithTimeout(ctx, kernelStartTimeout)
	defer cancel()
	connFile := filepath.Join(cfg.dir, "kernel-"+randomHex(8)+".json")
	cmd := exec.Command(cfg.tools.Python, "-Xfrozen_modules=off", "-m", "ipykernel_launcher", "-f", connFile,
		"--HistoryManager.enabled=False", "--IPKernelApp.ip=127.0.0.1")
	cfg.env = append(cfg.env, "MPLBACKEND=module://matplotlib_inline.backend_inline", "PYTHONUNBUFFERED=1",
		"PYDEVD_DISABLE_FILE_VALIDATION=1")
	p, err := startProc(cmd, cfg)
	if err != nil {
		return nil, fmt.Errorf("starting %s: %w", cfg.tools.Python, err)
	}
	k := &jupyterKernel{proc: p, session: randomHex(16),
		shellIn: make(chan *jmsg, 64), iopubIn: make(chan *jmsg, 1024)}
	defer func() {
		if err != nil {
			k.kill()
		}
		os.Remove(connFile)
	}()
	info, err := waitConnFile(ctx, connFile, p)
	if err != nil {
		return nil, err
	}
	if info.Transport != "tcp" || info.Scheme != "hmac-sha256" {
		return nil, fmt.Errorf("kernel wants transport %q and signature %q; want tcp and hmac-sha256", info.Transport, info.Scheme)
	}
	k.key = []byte(info.Key)
	if k.shell, err = dialZMTP(ctx, net.JoinHostPort(info.IP, strconv.Itoa(info.ShellPort)), "DEALER"); err != nil {
		return nil, err
	}
	if k.iopub, err = dialZMTP(ctx, net.JoinHostPort(info.IP, strconv.Itoa(info.IOPubPort)), "SUB"); err != nil {
		k.shell.close()
		return nil, err
	}
	if err := k.iopub.send([][]byte{{1}}); err != nil {
		return nil, err
	}
	go k.read(k.shell, k.shellIn)
	go k.read(k.iopub, k.iopubIn)
	if err := k.waitReady(ctx); err != nil {
		return nil, err
	}
	var silent bytes.Buffer
	if _, err := k.execute(ctx, setupPy, true, func(e Event) {
		if e.Type == EventError || e.Type == EventStderr {
			fmt.Fprintf(&silent, "%s %s %s\n", e.Name, e.Value, e.Text)
		}
	}); err != nil {
		return nil, err
	}
	if silent.Len() > 0 {
		return nil, fmt.Errorf("kernel start-up code failed: %s", strings.TrimSpace(silent.String()))
	}
	return k, nil
}

// waitConnFile waits for the kernel to write the connection file, or to
// exit.
func waitConnFile(ctx context.Context, name string, p *proc) (connInfo, error) {
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		if b, err := os.ReadFile(name); err == nil {
			var info connInfo
			// A file being written reads as invalid JSON; the next tick
			// sees all of it.
			if json.Unmarshal(b, &info) == nil && info.ShellPort != 0 && info.IOPubPort != 0 {
				return info, nil
			}
		}
		select {
		case <-p.done():
			return connInfo{}, p.died()
		case <-ctx.Done():
			return connInfo{}, fmt.Errorf("waiting for the kernel's connection file: %w", ctx.Err())
		case <-tick.C:
		}
	}
}

// waitReady sends kernel_info requests until one is answered on the shell
// socket and seen on IOPub: a SUB socket receives only what is published
// after its subscription reached the publisher.
func (k *jupyterKernel) waitReady(ctx context.Context) error {
	for {
		id, err := k.send("kernel_info_request", struct{}{})
		if err != nil {
			return err
		}
		var replied, published bool
		retry := time.After(250 * time.Millisecond)
	wait:
		for !(replied && published) {
			select {
			case m := <-k.shellIn:
				replied = replied || m.Parent.MsgID == id
			case m := <-k.iopubIn:
				published = published || m.Parent.MsgID == id
			case <-retry:
				break wait
			case <-k.done():
				return k.died()
			case <-ctx.Done():
				return fmt.Errorf("waiting for the kernel to answer: %w", ctx.Err())
			}
		}
		if replied && published {
			return nil
		}
	}
}

// read delivers the messages of z to ch until z fails.
func (k *jupyterKernel) read(z *zconn, ch chan<- *jmsg) {
	for {
		frames, err := z.recv()
		if err != nil {
			return
		}
		m, err := k.parse(frames)
		if err != nil {
			continue
		}
		select {
		case ch <- m:
		case <-k.done():
			return
		}
	}
}

const delimiter = "<IDS|MSG>"

// parse checks the signature of a message and decodes its header, parent
// header and content. "The signature is the HMAC hex digest of the
// concatenation of: header, parent header, metadata, content."
func (k *jupyterKernel) parse(frames [][]byte) (*jmsg, error) {
	i := 0
	for i < len(frames) && string(frames[i]) != delimiter {
		i++
	}
	if len(frames) < i+6 {
		return nil, errors.New("short message")
	}
	f := frames[i+1:]
	mac := hmac.New(sha256.New, k.key)
	for _, part := range f[1:5] {
		mac.Write(part)
	}
	if !hmac.Equal([]byte(hex.EncodeToString(mac.Sum(nil))), f[0]) {
		return nil, errors.New("bad signature")
	}
	m := &jmsg{Content: f[4]}
	if err := json.Unmarshal(f[1], &m.Header); err != nil {
		return nil, err
	}
	if err := json.Unmarshal(f[2], &m.Parent); err != nil {
		return nil, err
	}
	return m, nil
}

// send sends a shell request and returns its message id.
func (k *jupyterKernel) send(msgType string, content any) (string, error) {
	id := randomHex(16)
	header, _ := json.Marshal(map[string]string{
		"msg_id": id, "session": k.session, "username": "corral", "msg_type": msgType,
		"version": "5.3", "date": time.Now().UTC().Format(time.RFC3339Nano),
	})
	body, err := json.Marshal(content)
	if err != nil {
		return "", err
	}
	parts := [][]byte{header, []byte("{}"), []byte("{}"), body}
	mac := hmac.New(sha256.New, k.key)
	for _, p := range parts {
		mac.Write(p)
	}
	sig := []byte(hex.EncodeToString(mac.Sum(nil)))
	if err := k.shell.send(append([][]byte{[]byte(delimiter), sig}, parts...)); err != nil {
		return "", fmt.Errorf("sending %s to the kernel: %w", msgType, err)
	}
	return id, nil
}

// envCode is the Python that sets env for one execution (push) and
// restores what was there before (pop); the helpers are setup.py's.
func envCode(env map[string]string) (push, pop string) {
	b, _ := json.Marshal(env)
	return "__import__('_corral').env_push(" + strconv.Quote(string(b)) + ")", "__import__('_corral').env_pop()"
}

func (k *jupyterKernel) run(ctx context.Context, code string, env map[string]string, emit func(Event)) (int, error) {
	if len(env) > 0 {
		push, pop := envCode(env)
		if _, err := k.execute(context.WithoutCancel(ctx), push, true, func(Event) {}); err != nil {
			return 0, err
		}
		defer k.execute(context.WithoutCancel(ctx), pop, true, func(Event) {})
	}
	return k.execute(ctx, code, false, emit)
}

// execute runs one execute_request and forwards its IOPub outputs until
// the kernel is idle again and has replied.
//
// stop_on_error is false: "if True, aborts the execution queue if an
// exception is encountered". This service sends one request at a time, so
// the only request ipykernel would abort is the next client's, when it
// arrives before the kernel's event loop has turned once after the error;
// that request would end at once, with neither output nor error.
func (k *jupyterKernel) execute(ctx context.Context, code string, silent bool, emit func(Event)) (int, error) {
	id, err := k.send("execute_request", map[string]any{
		"code": code, "silent": silent, "store_history": !silent,
		"user_expressions": map[string]any{}, "allow_stdin": false, "stop_on_error": false,
	})
	if err != nil {
		return 0, err
	}
	var (
		idle, replied bool
		count         int
		cancel        = ctx.Done()
		grace         <-chan time.Time
		// afterReply bounds the wait for "idle" once the reply is in and
		// IOPub has gone quiet: the kernel's PUB socket drops messages for
		// a subscriber that falls too far behind, and a lost idle must not
		// hold the context.
		afterReply <-chan time.Time
	)
	for !(idle && replied) {
		select {
		case m := <-k.iopubIn:
			if m.Parent.MsgID != id {
				continue
			}
			if replied {
				afterReply = time.After(idleAfterReply)
			}
			switch m.Header.MsgType {
			case "status":
				var c struct {
					State string `json:"execution_state"`
				}
				json.Unmarshal(m.Content, &c)
				idle = idle || c.State == "idle"
			default:
				if e, ok := iopubEvent(m); ok {
					emit(e)
				}
			}
		case m := <-k.shellIn:
			if m.Parent.MsgID != id {
				continue
			}
			var c struct {
				Count int `json:"execution_count"`
			}
			json.Unmarshal(m.Content, &c)
			count, replied = c.Count, true
			afterReply = time.After(idleAfterReply)
		case <-afterReply:
			idle = true
		case <-cancel:
			cancel = nil
			k.signal(syscall.SIGINT)
			grace = settle()
		case <-grace:
			k.kill()
			return 0, fmt.Errorf("%w: it did not stop within %s of an interrupt", errKernelDied, interruptGrace)
		case <-k.done():
			return 0, k.died()
		}
	}
	return count, nil
}

// iopubEvent turns an IOPub output message into an event.
func iopubEvent(m *jmsg) (Event, bool) {
	switch m.Header.MsgType {
	case "stream":
		var c struct{ Name, Text string }
		json.Unmarshal(m.Content, &c)
		if c.Name == "stderr" {
			return Event{Type: EventStderr, Text: c.Text}, true
		}
		return Event{Type: EventStdout, Text: c.Text}, true
	case "execute_result", "display_data", "update_display_data":
		var c struct {
			Data map[string]any `json:"data"`
		}
		json.Unmarshal(m.Content, &c)
		return Event{Type: EventResult, Result: resultFields(c.Data), Main: m.Header.MsgType == "execute_result"}, true
	case "error":
		var c struct {
			Name      string   `json:"ename"`
			Value     string   `json:"evalue"`
			Traceback []string `json:"traceback"`
		}
		json.Unmarshal(m.Content, &c)
		return Event{Type: EventError, Name: c.Name, Value: c.Value, Traceback: stripANSI(strings.Join(c.Traceback, "\n"))}, true
	}
	return Event{}, false
}

// stripANSI removes terminal colour sequences (ESC [ ... letter), which
// IPython puts in tracebacks unless told otherwise.
func stripANSI(s string) string {
	if !strings.Contains(s, "\x1b[") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == 0x1b && i+1 < len(s) && s[i+1] == '[' {
			j := i + 2
			for j < len(s) && (s[j] < 0x40 || s[j] > 0x7e) {
				j++
			}
			i = j
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func (k *jupyterKernel) kill() {
	k.proc.kill()
	if k.shell != nil {
		k.shell.close()
	}
	if k.iopub != nil {
		k.iopub.close()
	}
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}
