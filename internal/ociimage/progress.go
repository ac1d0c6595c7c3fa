package ociimage

import (
	"fmt"
	"io"
	"strings"
	"sync"

	"golang.org/x/term"
)

// Progress is one report about one blob of a pull or load. Reports for a
// blob come in order: a first one with Current 0 (or a single one with
// Cached set), then growing Current, then one with Done set. Reports for
// different blobs interleave when blobs transfer in parallel. It is
// JSON-serializable so the daemon can stream it to a client.
type Progress struct {
	// Action is what is happening, for example "pulling layer".
	Action string `json:"action"`
	// ID names the blob, as a digest.
	ID string `json:"id"`
	// Current and Total count bytes; Total is -1 when unknown.
	Current int64 `json:"current"`
	Total   int64 `json:"total"`
	// Cached means the blob was in the cache and nothing was transferred.
	Cached bool `json:"cached,omitempty"`
	// Done means the blob is complete.
	Done bool `json:"done,omitempty"`
}

// progressStep is how many bytes pass between reports of one blob.
const progressStep = 1 << 20

// reporter turns byte counts of one blob into Progress reports, at most
// one per progressStep bytes. A nil reporter reports nothing.
type reporter struct {
	fn       func(Progress)
	ev       Progress
	lastSent int64
}

func newReporter(fn func(Progress), action, id string, total int64) *reporter {
	if fn == nil {
		return nil
	}
	return &reporter{fn: fn, ev: Progress{Action: action, ID: id, Total: total}}
}

func (r *reporter) start() {
	if r != nil {
		r.fn(r.ev)
	}
}

func (r *reporter) cached() {
	if r != nil {
		ev := r.ev
		ev.Cached, ev.Done, ev.Current = true, true, max(ev.Total, 0)
		r.fn(ev)
	}
}

func (r *reporter) update(n int64) {
	if r != nil && n-r.lastSent >= progressStep {
		r.lastSent = n
		ev := r.ev
		ev.Current = n
		r.fn(ev)
	}
}

func (r *reporter) done(n int64) {
	if r != nil {
		ev := r.ev
		ev.Current, ev.Done = n, true
		if ev.Total < 0 {
			ev.Total = n
		}
		r.fn(ev)
	}
}

// ProgressPrinter renders Progress reports for a person. On a terminal it
// keeps one status line that it redraws:
//
//	pulling 2/5 [=========>          ] 12.3 MiB/40.0 MiB
//
// Anywhere else it prints plain lines, one when a blob starts, one each
// time it passes another tenth of its size, and one when it is done:
//
//	pulling layer sha256:0123456789ab… 12.3 MiB/40.0 MiB
//
// Its methods are safe for concurrent use, so Update can be passed as a
// progress callback directly.
type ProgressPrinter struct {
	mu    sync.Mutex
	w     io.Writer
	tty   bool
	blobs map[string]*blobState
	order []string
	drawn bool
}

type blobState struct {
	ev        Progress
	lastTenth int64
}

// NewProgressPrinter returns a printer writing to w, drawing a bar when w
// is a terminal (an *os.File, or anything with an Fd method, that
// term.IsTerminal accepts).
func NewProgressPrinter(w io.Writer) *ProgressPrinter {
	tty := false
	if f, ok := w.(interface{ Fd() uintptr }); ok {
		tty = term.IsTerminal(int(f.Fd()))
	}
	return &ProgressPrinter{w: w, tty: tty, blobs: make(map[string]*blobState)}
}

// Update renders one report.
func (p *ProgressPrinter) Update(ev Progress) {
	p.mu.Lock()
	defer p.mu.Unlock()
	b, ok := p.blobs[ev.ID]
	if !ok {
		b = &blobState{lastTenth: -1}
		p.blobs[ev.ID] = b
		p.order = append(p.order, ev.ID)
	}
	b.ev = ev
	if p.tty {
		p.drawBar(ev.Action)
		return
	}
	switch {
	case ev.Cached:
		fmt.Fprintf(p.w, "%s %s: already cached (%s)\n", ev.Action, shortID(ev.ID), size(ev.Total))
	case ev.Done:
		fmt.Fprintf(p.w, "%s %s %s/%s done\n", ev.Action, shortID(ev.ID), size(ev.Current), size(ev.Total))
	default:
		tenth := int64(0)
		if ev.Total > 0 {
			tenth = ev.Current * 10 / ev.Total
		}
		if tenth > b.lastTenth {
			b.lastTenth = tenth
			fmt.Fprintf(p.w, "%s %s %s/%s\n", ev.Action, shortID(ev.ID), size(ev.Current), size(ev.Total))
		}
	}
}

// drawBar redraws the status line from the totals of all blobs seen.
func (p *ProgressPrinter) drawBar(action string) {
	var cur, total int64
	done := 0
	for _, id := range p.order {
		ev := p.blobs[id].ev
		cur += ev.Current
		total += max(ev.Total, ev.Current)
		if ev.Done {
			done++
		}
	}
	const width = 30
	fill := width
	if total > 0 {
		fill = int(cur * width / total)
	}
	bar := strings.Repeat("=", fill)
	if fill < width {
		bar += ">" + strings.Repeat(" ", width-fill-1)
	}
	verb, _, _ := strings.Cut(action, " ")
	fmt.Fprintf(p.w, "\r\x1b[2K%s %d/%d [%s] %s/%s", verb, done, len(p.order), bar, size(cur), size(total))
	p.drawn = true
}

// Close ends the status line on a terminal. The printer can be used again
// afterwards; it starts a new line.
func (p *ProgressPrinter) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.drawn {
		p.drawn = false
		_, err := io.WriteString(p.w, "\n")
		return err
	}
	return nil
}

// shortID shortens a digest for people: "sha256:0123456789ab…".
func shortID(id string) string {
	algo, hex, ok := strings.Cut(id, ":")
	if !ok || len(hex) <= 12 {
		return id
	}
	return algo + ":" + hex[:12] + "…"
}

// size formats a byte count in binary units with one decimal.
func size(n int64) string {
	switch {
	case n < 0:
		return "?"
	case n < 1<<10:
		return fmt.Sprintf("%d B", n)
	case n < 1<<20:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	case n < 1<<30:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	}
	return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
}
