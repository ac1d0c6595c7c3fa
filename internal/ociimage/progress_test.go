package ociimage

import (
	"bytes"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

const (
	digestA = "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	digestB = "sha256:bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
)

// events is a pull of one cached and one downloaded 40 MiB layer,
// reported every MiB as Pull does.
func events() []Progress {
	evs := []Progress{{Action: "pulling layer", ID: digestA, Current: 1 << 20, Total: 1 << 20, Cached: true, Done: true}}
	var rep []Progress
	r := newReporter(func(p Progress) { rep = append(rep, p) }, "pulling layer", digestB, 40<<20)
	r.start()
	for n := int64(64 << 10); n <= 40<<20; n += 64 << 10 {
		r.update(n)
	}
	r.done(40 << 20)
	return append(evs, rep...)
}

func TestProgressPlainLines(t *testing.T) {
	var out bytes.Buffer
	p := NewProgressPrinter(&out)
	for _, ev := range events() {
		p.Update(ev)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"pulling layer sha256:aaaaaaaaaaaa…: already cached (1.0 MiB)",
		"pulling layer sha256:bbbbbbbbbbbb… 0 B/40.0 MiB",
		"pulling layer sha256:bbbbbbbbbbbb… 4.0 MiB/40.0 MiB",
		"pulling layer sha256:bbbbbbbbbbbb… 8.0 MiB/40.0 MiB",
		"pulling layer sha256:bbbbbbbbbbbb… 12.0 MiB/40.0 MiB",
		"pulling layer sha256:bbbbbbbbbbbb… 16.0 MiB/40.0 MiB",
		"pulling layer sha256:bbbbbbbbbbbb… 20.0 MiB/40.0 MiB",
		"pulling layer sha256:bbbbbbbbbbbb… 24.0 MiB/40.0 MiB",
		"pulling layer sha256:bbbbbbbbbbbb… 28.0 MiB/40.0 MiB",
		"pulling layer sha256:bbbbbbbbbbbb… 32.0 MiB/40.0 MiB",
		"pulling layer sha256:bbbbbbbbbbbb… 36.0 MiB/40.0 MiB",
		"pulling layer sha256:bbbbbbbbbbbb… 40.0 MiB/40.0 MiB",
		"pulling layer sha256:bbbbbbbbbbbb… 40.0 MiB/40.0 MiB done",
	}
	if diff := cmp.Diff(want, strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")); diff != "" {
		t.Errorf("output (-want +got):\n%s", diff)
	}
}

func TestProgressBar(t *testing.T) {
	var out bytes.Buffer
	p := NewProgressPrinter(&out)
	p.tty = true // a bytes.Buffer is no terminal; draw as if it were
	evs := events()
	for _, ev := range evs {
		p.Update(ev)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	s := out.String()
	if n := strings.Count(s, "\r\x1b[2K"); n != len(evs) {
		t.Errorf("redrew the line %d times, want %d", n, len(evs))
	}
	if strings.Count(s, "\n") != 1 || !strings.HasSuffix(s, "\n") {
		t.Errorf("bar output has other newlines than the final one: %q", s)
	}
	frames := strings.Split(strings.TrimSuffix(s, "\n"), "\r\x1b[2K")
	if last := frames[len(frames)-1]; last != "pulling 2/2 [==============================] 41.0 MiB/41.0 MiB" {
		t.Errorf("last frame = %q", last)
	}
}
