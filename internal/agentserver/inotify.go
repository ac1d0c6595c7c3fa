package agentserver

import (
	"bytes"
	"encoding/binary"
	"path"
	"time"

	"github.com/corralrun/corral/internal/wire"
	"golang.org/x/sys/unix"
)

// decode turns one read of inotify events into watch events. ended is
// true when the root is gone.
func (wt *watcher) decode(b []byte, now time.Time) (out []wire.WatchEvent, ended bool) {
	bt := &eventBatch{
		wt:        wt,
		now:       now,
		lastWrite: make(map[string]bool),
		moves:     make(map[uint32]int),
		movedDirs: make(map[uint32]string),
	}
	defer bt.forgetMovedAway()
	for {
		ev, rest, ok := nextInotifyEvent(b)
		if !ok {
			return bt.out, false
		}
		b = rest
		if bt.add(ev) {
			return bt.out, true
		}
	}
}

// inotifyEvent is one struct inotify_event of inotify(7).
type inotifyEvent struct {
	wd     int32
	mask   uint32
	cookie uint32
	name   string // "" for an event about the watched directory itself
}

// nextInotifyEvent splits the first event off b; ok is false when b holds
// no whole event.
func nextInotifyEvent(b []byte) (ev inotifyEvent, rest []byte, ok bool) {
	if len(b) < unix.SizeofInotifyEvent {
		return inotifyEvent{}, nil, false
	}
	n := int(binary.NativeEndian.Uint32(b[12:]))
	if unix.SizeofInotifyEvent+n > len(b) {
		return inotifyEvent{}, nil, false // cannot happen: the kernel returns whole events
	}
	ev = inotifyEvent{
		wd:     int32(binary.NativeEndian.Uint32(b[0:])),
		mask:   binary.NativeEndian.Uint32(b[4:]),
		cookie: binary.NativeEndian.Uint32(b[8:]),
		name:   string(bytes.TrimRight(b[unix.SizeofInotifyEvent:unix.SizeofInotifyEvent+n], "\x00")),
	}
	return ev, b[unix.SizeofInotifyEvent+n:], true
}

// eventBatch is the watch events of one read from the kernel, being made.
type eventBatch struct {
	wt        *watcher
	now       time.Time
	out       []wire.WatchEvent
	lastWrite map[string]bool // path -> its latest event is a write
	moves     map[uint32]int  // cookie -> index of its moved-from event
	// Directories moved away keep their watches until the batch ends: if
	// they reappear within the tree, the watches (which follow the inode)
	// only change name, and nothing in them is missed.
	movedDirs map[uint32]string
}

func (bt *eventBatch) emit(ev wire.WatchEvent) {
	ev.Time = bt.now
	bt.lastWrite[ev.Path] = ev.Type == wire.WatchWrite
	bt.out = append(bt.out, ev)
}

// forgetMovedAway drops the watches of directories that left the tree in
// this batch.
func (bt *eventBatch) forgetMovedAway() {
	for _, dir := range bt.movedDirs {
		bt.wt.forgetTree(dir)
	}
}

// add turns ev into watch events; ended is true when the root is gone.
func (bt *eventBatch) add(ev inotifyEvent) (ended bool) {
	wt := bt.wt
	if ev.mask&unix.IN_Q_OVERFLOW != 0 {
		bt.emit(wire.WatchEvent{Type: wire.WatchOverflow, Path: wt.root})
		return false
	}
	dir, ok := wt.dirs[ev.wd]
	if !ok {
		return false // a watch dropped already; its last events trail behind
	}
	if ev.name == "" && ev.wd != wt.rootWD && ev.mask&unix.IN_IGNORED == 0 {
		return false // about a directory below the root: its parent reports it
	}
	isDir := ev.mask&unix.IN_ISDIR != 0
	p := dir
	if ev.name != "" {
		p = path.Join(dir, ev.name)
	}
	switch mask := ev.mask; {
	case mask&unix.IN_IGNORED != 0:
		delete(wt.dirs, ev.wd)
		return ev.wd == wt.rootWD
	case mask&(unix.IN_DELETE_SELF|unix.IN_MOVE_SELF) != 0:
		// Only the root gets here: it has no watched parent.
		typ := wire.WatchRemove
		if mask&unix.IN_MOVE_SELF != 0 {
			typ = wire.WatchRename
		}
		bt.emit(wire.WatchEvent{Type: typ, Path: wt.root, IsDir: true})
		return true
	case mask&unix.IN_CREATE != 0:
		bt.created(p, isDir)
	case mask&unix.IN_MOVED_FROM != 0:
		bt.moves[ev.cookie] = len(bt.out)
		bt.emit(wire.WatchEvent{Type: wire.WatchRename, Path: p, IsDir: isDir})
		if isDir {
			bt.movedDirs[ev.cookie] = p
		}
	case mask&unix.IN_MOVED_TO != 0:
		if !bt.movedWithin(ev.cookie, p) {
			bt.created(p, isDir)
		}
	case mask&unix.IN_DELETE != 0:
		bt.emit(wire.WatchEvent{Type: wire.WatchRemove, Path: p, IsDir: isDir})
	case mask&unix.IN_ATTRIB != 0:
		bt.emit(wire.WatchEvent{Type: wire.WatchChmod, Path: p, IsDir: isDir})
	case mask&(unix.IN_MODIFY|unix.IN_CLOSE_WRITE) != 0:
		if !bt.lastWrite[p] {
			bt.emit(wire.WatchEvent{Type: wire.WatchWrite, Path: p, IsDir: isDir})
		}
	}
	return false
}

// created reports p as created and, recursively, watches a new directory
// and what it already holds.
func (bt *eventBatch) created(p string, isDir bool) {
	bt.emit(wire.WatchEvent{Type: wire.WatchCreate, Path: p, IsDir: isDir})
	if isDir && bt.wt.recursive {
		bt.wt.addTree(p, &bt.out, bt.now)
	}
}

// movedWithin completes the rename of this batch with cookie, now that
// its new name p is known, and reports false when the batch has none: the
// move came from outside the tree.
func (bt *eventBatch) movedWithin(cookie uint32, p string) bool {
	i, ok := bt.moves[cookie]
	if !ok {
		return false
	}
	delete(bt.moves, cookie)
	bt.out[i].OldPath, bt.out[i].Path = bt.out[i].Path, p
	bt.lastWrite[p] = false
	if old, ok := bt.movedDirs[cookie]; ok {
		delete(bt.movedDirs, cookie)
		bt.wt.renameTree(old, p)
	}
	return true
}
