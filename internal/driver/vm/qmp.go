package vm

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"
)

// qmp is a connection to a QEMU process's QMP socket (QEMU Machine
// Protocol: one JSON object a line; the server greets, the client
// negotiates with qmp_capabilities, then every command gets one "return"
// or "error" object, with asynchronous "event" objects in between).
// Commands on one connection are serialized.
type qmp struct {
	mu   sync.Mutex
	conn net.Conn
	r    *bufio.Reader
}

// dialQMP connects to the QMP socket at path, retrying until QEMU has
// created it or ctx ends, and negotiates capabilities.
func dialQMP(ctx context.Context, path string) (*qmp, error) {
	var d net.Dialer
	for {
		c, err := d.DialContext(ctx, "unix", path)
		if err == nil {
			q := &qmp{conn: c, r: bufio.NewReader(c)}
			if err := q.handshake(ctx); err != nil {
				c.Close()
				return nil, err
			}
			return q, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("connecting to QMP: %w", errors.Join(ctx.Err(), err))
		case <-time.After(5 * time.Millisecond):
		}
	}
}

func (q *qmp) handshake(ctx context.Context) error {
	var greeting struct {
		QMP json.RawMessage `json:"QMP"`
	}
	if err := q.read(ctx, &greeting); err != nil {
		return fmt.Errorf("reading QMP greeting: %w", err)
	}
	if greeting.QMP == nil {
		return errors.New("reading QMP greeting: no QMP object")
	}
	return q.execute(ctx, "qmp_capabilities", nil)
}

// read decodes the next line into v, bounded by ctx. Only ctx's end
// interrupts the read, so that an interrupted read reports ctx's error
// (a deadline of the connection's own could fire first and report a
// plain timeout).
func (q *qmp) read(ctx context.Context, v any) error {
	q.conn.SetReadDeadline(time.Time{})
	stop := context.AfterFunc(ctx, func() { q.conn.SetReadDeadline(time.Unix(1, 0)) })
	defer stop()
	line, err := q.r.ReadBytes('\n')
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return err
	}
	return json.Unmarshal(line, v)
}

// qmpError is QEMU's answer to a command it refused.
type qmpError struct {
	Class string `json:"class"`
	Desc  string `json:"desc"`
}

func (e *qmpError) Error() string { return e.Class + ": " + e.Desc }

// execute runs command, one that takes no arguments, and decodes its
// return value into out (nil to ignore it).
func (q *qmp) execute(ctx context.Context, command string, out any) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	req, err := json.Marshal(map[string]string{"execute": command})
	if err != nil {
		return err
	}
	q.conn.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if _, err := q.conn.Write(append(req, '\n')); err != nil {
		return fmt.Errorf("sending QMP %s: %w", command, err)
	}
	for {
		var resp struct {
			Return json.RawMessage `json:"return"`
			Error  *qmpError       `json:"error"`
			Event  string          `json:"event"`
		}
		if err := q.read(ctx, &resp); err != nil {
			return fmt.Errorf("reading QMP %s: %w", command, err)
		}
		switch {
		case resp.Error != nil:
			return fmt.Errorf("QMP %s: %w", command, resp.Error)
		case resp.Event != "":
			continue
		case out != nil:
			return json.Unmarshal(resp.Return, out)
		default:
			return nil
		}
	}
}

// status returns QEMU's run state ("running", "paused", "prelaunch", ...).
func (q *qmp) status(ctx context.Context) (string, error) {
	var st struct {
		Status string `json:"status"`
	}
	err := q.execute(ctx, "query-status", &st)
	return st.Status, err
}

func (q *qmp) close() error { return q.conn.Close() }
