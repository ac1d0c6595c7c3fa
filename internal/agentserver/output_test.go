package agentserver

import (
	"bytes"
	"slices"
	"strings"
	"testing"
)

// readAll reads the log from pos to its current end, returning the bytes,
// the streams of the pieces and the total skipped.
func readAll(l *outputLog, pos int64) (data []byte, streams []streamID, skipped int64) {
	for {
		p, s, _, _ := l.next(pos)
		skipped += s
		if len(p.data) == 0 {
			return data, streams, skipped
		}
		if p.off != pos+s {
			panic("piece does not start where asked")
		}
		data = append(data, p.data...)
		streams = append(streams, p.stream)
		pos = p.off + int64(len(p.data))
	}
}

func TestOutputLog(t *testing.T) {
	tests := []struct {
		name        string
		writes      []string // "o:" or "e:" prefix names the stream
		from        int64
		want        string
		wantStreams []streamID
		wantSkipped int64
	}{
		{name: "empty", want: ""},
		{name: "merges one stream", writes: []string{"o:ab", "o:cd"}, want: "abcd", wantStreams: []streamID{streamStdout}},
		{name: "splits at stream changes", writes: []string{"o:a", "e:b", "o:c"}, want: "abc", wantStreams: []streamID{streamStdout, streamStderr, streamStdout}},
		{name: "from the middle of a piece", writes: []string{"o:abcdef"}, from: 2, want: "cdef", wantStreams: []streamID{streamStdout}},
		{name: "from the end", writes: []string{"o:abc"}, from: 3, want: ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := newOutputLog()
			for _, w := range tt.writes {
				id := streamStdout
				if strings.HasPrefix(w, "e:") {
					id = streamStderr
				}
				l.write(id, []byte(w[2:]))
			}
			got, streams, skipped := readAll(l, tt.from)
			if string(got) != tt.want || skipped != tt.wantSkipped || !slices.Equal(streams, tt.wantStreams) {
				t.Fatalf("read %q streams %v skipped %d, want %q %v %d", got, streams, skipped, tt.want, tt.wantStreams, tt.wantSkipped)
			}
		})
	}
}

// The log keeps exactly the last outputLogBytes, and a reader behind that
// skips ahead by what it missed.
func TestOutputLogBound(t *testing.T) {
	l := newOutputLog()
	chunk := bytes.Repeat([]byte("0123456789"), 1000)
	var total int64
	for range 300 {
		l.write(streamStdout, chunk)
		total += int64(len(chunk))
	}
	start, end := l.bounds()
	if end != total || end-start != outputLogBytes {
		t.Fatalf("bounds %d..%d, want %d..%d", start, end, total-outputLogBytes, total)
	}
	data, _, skipped := readAll(l, 0)
	if int64(len(data)) != outputLogBytes || skipped != total-outputLogBytes {
		t.Fatalf("read %d bytes skipping %d", len(data), skipped)
	}
	// Offsets are positions in the whole output: the byte at offset o is
	// "0123456789"[o%10].
	if want := byte('0' + start%10); data[0] != want {
		t.Fatalf("first kept byte %q, want %q", data[0], want)
	}
}

// Alternating streams cannot make the bookkeeping grow past its bound.
func TestOutputLogPieceBound(t *testing.T) {
	l := newOutputLog()
	for i := range 3 * outputLogChunks {
		l.write(streamID(i%2), []byte("x"))
	}
	if n := len(l.pieces); n > outputLogChunks {
		t.Fatalf("%d pieces, want at most %d", n, outputLogChunks)
	}
	start, end := l.bounds()
	if end != 3*outputLogChunks || end-start != outputLogChunks {
		t.Fatalf("bounds %d..%d", start, end)
	}
}

// Followers wake on output and on close.
func TestOutputLogWake(t *testing.T) {
	l := newOutputLog()
	_, _, wake, closed := l.next(0)
	if closed {
		t.Fatal("new log is closed")
	}
	l.write(streamStdout, []byte("x"))
	select {
	case <-wake:
	default:
		t.Fatal("write did not wake followers")
	}
	_, _, wake, _ = l.next(1)
	l.close()
	select {
	case <-wake:
	default:
		t.Fatal("close did not wake followers")
	}
	if _, _, _, closed := l.next(1); !closed {
		t.Fatal("log not closed")
	}
}
