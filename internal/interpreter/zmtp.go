package interpreter

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// This file is a ZeroMQ client of just the reach a Jupyter client needs:
// DEALER and SUB sockets over TCP with the NULL security mechanism,
// speaking ZMTP 3.0 (rfc.zeromq.org/spec/23). A kernel binds ROUTER, PUB
// and REP sockets with libzmq; each zconn is one connection to one of them.
//
// The rules followed, from the specification:
//   - "greeting = signature version mechanism as-server filler", 64 octets:
//     %xFF, 8 octets of padding, %x7F; version %x03 %x00; "NULL" padded to
//     20 octets; as-server %x00; 31 octets of zero filler.
//   - The NULL handshake is one READY command each way, whose metadata
//     names the Socket-Type (and, for a DEALER, may name an Identity).
//   - A frame is a flags octet (bit 0 MORE, bit 1 LONG, bit 2 COMMAND), a
//     size (one octet, or eight in network order when LONG) and the body.
//   - A ZMTP 3.0 SUB subscribes by sending a message whose first octet is
//     %x01 followed by the prefix; an empty prefix matches every message.

const (
	flagMore    = 0x01
	flagLong    = 0x02
	flagCommand = 0x04
)

// maxFrame bounds the size of one frame a zconn accepts, so that a kernel
// that sends an enormous display (or a peer that is not ZMTP) cannot make
// the service allocate without limit.
const maxFrame = 256 << 20

// errFrameTooLarge is returned by recv for a frame above maxFrame; the
// connection cannot continue after it.
var errFrameTooLarge = errors.New("zmtp: frame larger than the limit")

// zconn is one ZMTP connection. send and recv may be used from different
// goroutines; sends are serialized with each other, and recv must have one
// caller at a time.
type zconn struct {
	c  net.Conn
	r  *bufio.Reader
	mu sync.Mutex // serializes send
}

// dialZMTP connects to addr (host:port) as a socketType ("DEALER" or "SUB")
// and completes the NULL handshake.
func dialZMTP(ctx context.Context, addr, socketType string) (*zconn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	z := &zconn{c: c, r: bufio.NewReaderSize(c, 64<<10)}
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	if err := z.handshake(socketType); err != nil {
		c.Close()
		return nil, fmt.Errorf("zmtp handshake with %s: %w", addr, err)
	}
	c.SetDeadline(time.Time{})
	return z, nil
}

func (z *zconn) handshake(socketType string) error {
	var g [64]byte
	g[0], g[9] = 0xff, 0x7f
	g[10], g[11] = 3, 0
	copy(g[12:32], "NULL")
	if _, err := z.c.Write(g[:]); err != nil {
		return err
	}
	var peer [64]byte
	if _, err := io.ReadFull(z.r, peer[:]); err != nil {
		return fmt.Errorf("reading greeting: %w", err)
	}
	if peer[0] != 0xff || peer[9] != 0x7f || peer[10] < 3 {
		return errors.New("peer is not a ZMTP 3 endpoint")
	}
	if mech := string(bytes.TrimRight(peer[12:32], "\x00")); mech != "NULL" {
		return fmt.Errorf("peer wants security mechanism %q, not NULL", mech)
	}
	if err := z.writeFrame(flagCommand, readyCommand(socketType)); err != nil {
		return err
	}
	flags, body, err := z.readFrame()
	if err != nil {
		return fmt.Errorf("reading READY: %w", err)
	}
	if flags&flagCommand == 0 || len(body) < 6 || body[0] != 5 || string(body[1:6]) != "READY" {
		if flags&flagCommand != 0 && len(body) > 6 && string(body[1:6]) == "ERROR" {
			return fmt.Errorf("peer refused: %s", body[7:])
		}
		return errors.New("peer did not send READY")
	}
	return nil
}

// readyCommand is the body of a READY command naming socketType.
func readyCommand(socketType string) []byte {
	var b bytes.Buffer
	b.WriteByte(5)
	b.WriteString("READY")
	prop := func(name, value string) {
		b.WriteByte(byte(len(name)))
		b.WriteString(name)
		binary.Write(&b, binary.BigEndian, uint32(len(value)))
		b.WriteString(value)
	}
	prop("Socket-Type", socketType)
	if socketType == "DEALER" {
		prop("Identity", "")
	}
	return b.Bytes()
}

// send writes one multi-frame message.
func (z *zconn) send(frames [][]byte) error {
	z.mu.Lock()
	defer z.mu.Unlock()
	w := bufio.NewWriterSize(z.c, 16<<10)
	for i, f := range frames {
		var flags byte
		if i < len(frames)-1 {
			flags |= flagMore
		}
		if err := writeFrameTo(w, flags, f); err != nil {
			return err
		}
	}
	return w.Flush()
}

func (z *zconn) writeFrame(flags byte, body []byte) error {
	z.mu.Lock()
	defer z.mu.Unlock()
	return writeFrameTo(z.c, flags, body)
}

func writeFrameTo(w io.Writer, flags byte, body []byte) error {
	var hdr [9]byte
	n := 2
	if len(body) > 255 {
		hdr[0] = flags | flagLong
		binary.BigEndian.PutUint64(hdr[1:], uint64(len(body)))
		n = 9
	} else {
		hdr[0] = flags
		hdr[1] = byte(len(body))
	}
	if _, err := w.Write(hdr[:n]); err != nil {
		return err
	}
	_, err := w.Write(body)
	return err
}

// recv reads the next message, skipping commands (a ZMTP 3.1 peer may send
// PING, which a 3.0 peer need not answer).
func (z *zconn) recv() ([][]byte, error) {
	var msg [][]byte
	for {
		flags, body, err := z.readFrame()
		if err != nil {
			return nil, err
		}
		if flags&flagCommand != 0 {
			continue
		}
		msg = append(msg, body)
		if flags&flagMore == 0 {
			return msg, nil
		}
	}
}

func (z *zconn) readFrame() (byte, []byte, error) {
	flags, err := z.r.ReadByte()
	if err != nil {
		return 0, nil, err
	}
	var size uint64
	if flags&flagLong != 0 {
		var b [8]byte
		if _, err := io.ReadFull(z.r, b[:]); err != nil {
			return 0, nil, err
		}
		size = binary.BigEndian.Uint64(b[:])
	} else {
		b, err := z.r.ReadByte()
		if err != nil {
			return 0, nil, err
		}
		size = uint64(b)
	}
	if size > maxFrame {
		return 0, nil, errFrameTooLarge
	}
	body := make([]byte, size)
	if _, err := io.ReadFull(z.r, body); err != nil {
		return 0, nil, err
	}
	return flags, body, nil
}

func (z *zconn) close() error { return z.c.Close() }
