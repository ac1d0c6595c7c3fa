package agentserver

import (
	"slices"
	"sync"
)

const (
	// outputLogBytes is how much of a background process's output is kept
	// for re-attaching: the last 1 MiB.
	outputLogBytes = 1 << 20
	// outputLogChunks bounds the number of pieces the log holds, so that
	// a process alternating single bytes between stdout and stderr cannot
	// make the bookkeeping outgrow the bytes. Consecutive output of one
	// stream shares a piece, so ordinary programs never get near it.
	outputLogChunks = 8192
	// maxPieceBytes is the size a piece may grow to by merging reads; it
	// also bounds the output one event carries.
	maxPieceBytes = readBufSize
)

// outputLog keeps the tail of a process's combined stdout and stderr for
// re-attaching and lets any number of followers read it concurrently.
//
// Positions are offsets in everything the process wrote, stdout and
// stderr interleaved in the order they were read. The writer never waits
// for readers: a follower that falls more than outputLogBytes behind
// resumes at the oldest byte still kept and learns how much it missed
// (see next). Memory stays below about twice outputLogBytes (a merged
// piece may have spare capacity) plus a small header per piece.
type outputLog struct {
	mu     sync.Mutex
	pieces []piece // oldest first; offsets contiguous
	start  int64   // offset of the oldest kept byte
	end    int64   // offset after the newest byte: all output so far
	kept   int     // bytes held in pieces
	closed bool    // no more output will come
	// wake is closed and replaced whenever output arrives or the log
	// closes, so that followers can wait for it in a select.
	wake chan struct{}
}

// piece is a run of output of one stream. Its data is only ever appended
// to, never overwritten, so a follower may keep reading a slice of it
// after releasing the lock.
type piece struct {
	off    int64
	stream streamID
	data   []byte
}

func newOutputLog() *outputLog {
	return &outputLog{wake: make(chan struct{})}
}

// write appends a copy of b, read from stream id, dropping the oldest
// output beyond the bounds. It never blocks on followers.
func (l *outputLog) write(id streamID, b []byte) {
	if len(b) == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if n := len(l.pieces); n > 0 && l.pieces[n-1].stream == id && len(l.pieces[n-1].data)+len(b) <= maxPieceBytes {
		last := &l.pieces[n-1]
		last.data = append(last.data, b...)
	} else {
		l.pieces = append(l.pieces, piece{off: l.end, stream: id, data: append([]byte(nil), b...)})
	}
	l.end += int64(len(b))
	l.kept += len(b)
	for len(l.pieces) > outputLogChunks || l.kept-len(l.pieces[0].data) >= outputLogBytes {
		l.kept -= len(l.pieces[0].data)
		l.pieces[0] = piece{}
		l.pieces = l.pieces[1:]
	}
	if over := l.kept - outputLogBytes; over > 0 {
		first := &l.pieces[0]
		first.data = first.data[over:]
		first.off += int64(over)
		l.kept -= over
	}
	l.start = l.pieces[0].off
	l.notifyLocked()
}

// close marks the end of the output and wakes every follower. The log
// of an exited process may be kept for long, so pieces that merging left
// with much spare capacity are copied to fit.
func (l *outputLog) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, p := range l.pieces {
		if cap(p.data)-len(p.data) > len(p.data)/4 {
			l.pieces[i].data = append(make([]byte, 0, len(p.data)), p.data...)
		}
	}
	l.closed = true
	l.notifyLocked()
}

func (l *outputLog) notifyLocked() {
	close(l.wake)
	l.wake = make(chan struct{})
}

// bounds returns the offsets of the oldest kept byte and of the end.
func (l *outputLog) bounds() (start, end int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.start, l.end
}

// total returns how many bytes were written so far.
func (l *outputLog) total() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.end
}

// next returns the output at pos: the rest of the piece that holds it (at
// most maxPieceBytes, never modified afterwards). When pos is no longer
// kept, it starts at the oldest kept byte and skipped says how many bytes
// were passed over. When there is nothing at pos yet, p.data is empty and
// the caller waits on wake, unless closed says no more will come.
func (l *outputLog) next(pos int64) (p piece, skipped int64, wake <-chan struct{}, closed bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if pos < l.start {
		skipped, pos = l.start-pos, l.start
	}
	if pos >= l.end {
		return piece{off: pos}, skipped, l.wake, l.closed
	}
	// The first piece that ends after pos holds it.
	i, _ := slices.BinarySearchFunc(l.pieces, pos, func(p piece, pos int64) int {
		if p.off+int64(len(p.data)) <= pos {
			return -1
		}
		return 1
	})
	found := l.pieces[i]
	rel := pos - found.off
	return piece{off: pos, stream: found.stream, data: found.data[rel:len(found.data):len(found.data)]}, skipped, l.wake, l.closed
}
