package events

import (
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestFilter(t *testing.T) {
	b := NewBus(16)
	all := b.Subscribe(Filter{})
	one := b.Subscribe(Filter{SandboxID: "a"})
	deletes := b.Subscribe(Filter{Types: []string{Deleted}})
	for _, ev := range []Event{
		{Type: Created, SandboxID: "a"},
		{Type: Created, SandboxID: "b"},
		{Type: Deleted, SandboxID: "b"},
		{Type: Running, SandboxID: "a"},
	} {
		b.Publish(ev)
	}
	for _, s := range []*Subscription{all, one, deletes} {
		s.Close()
	}
	got := func(s *Subscription) []string {
		var out []string
		for ev := range s.C() {
			if ev.Time.IsZero() {
				t.Errorf("event %+v has no time", ev)
			}
			out = append(out, ev.Type+" "+ev.SandboxID)
		}
		return out
	}
	tests := []struct {
		name string
		sub  *Subscription
		want []string
	}{
		{"all", all, []string{"created a", "created b", "deleted b", "running a"}},
		{"sandbox", one, []string{"created a", "running a"}},
		{"type", deletes, []string{"deleted b"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, got(tt.sub)); diff != "" {
				t.Errorf("events (-want +got):\n%s", diff)
			}
		})
	}
}

// A subscriber that does not read is dropped with a final error event once
// its buffer is full, and never blocks the publisher or other subscribers.
func TestSlowSubscriberIsDropped(t *testing.T) {
	b := NewBus(4)
	slow := b.Subscribe(Filter{})
	fast := b.Subscribe(Filter{})
	var wg sync.WaitGroup
	recv := make(chan struct{})
	wg.Go(func() {
		for range fast.C() {
			recv <- struct{}{}
		}
	})
	fastGot := 0
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 100 {
			b.Publish(Event{Type: Running, SandboxID: "x"})
			<-recv // the fast subscriber keeps up
			fastGot++
		}
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Publish blocked on a slow subscriber")
	}
	var got []Event
	for ev := range slow.C() { // closed by the drop
		got = append(got, ev)
	}
	if len(got) != 5 {
		t.Fatalf("slow subscriber got %d events, want 4 and the error", len(got))
	}
	last := got[4]
	if last.Type != Error || last.SandboxID != "" || last.Error == nil || last.Error.Code != OverflowCode {
		t.Errorf("last event = %+v, want a stream error", last)
	}
	if n := b.Subscribers(); n != 1 {
		t.Errorf("%d subscribers left, want 1", n)
	}
	slow.Close() // after a drop: no panic
	fast.Close()
	fast.Close()
	wg.Wait()
	if fastGot != 100 {
		t.Errorf("the reading subscriber got %d events, want 100", fastGot)
	}
}

func TestCloseEndsSubscriptions(t *testing.T) {
	b := NewBus(4)
	before := b.Subscribe(Filter{})
	b.Close()
	b.Publish(Event{Type: Created, SandboxID: "a"})
	after := b.Subscribe(Filter{})
	for _, s := range []*Subscription{before, after} {
		if ev, ok := <-s.C(); ok {
			t.Errorf("got %+v after Close, want a closed channel", ev)
		}
		s.Close()
	}
	if n := b.Subscribers(); n != 0 {
		t.Errorf("%d subscribers after Close", n)
	}
}

// BenchmarkPublish is what one lifecycle change costs the Manager with
// ten subscribers (each iteration also receives the ten copies, so that no
// subscriber falls behind and is dropped).
func BenchmarkPublish(b *testing.B) {
	bus := NewBus(0)
	var subs []*Subscription
	for range 10 {
		subs = append(subs, bus.Subscribe(Filter{}))
	}
	for b.Loop() {
		bus.Publish(Event{Type: Running, SandboxID: "x"})
		for _, s := range subs {
			<-s.C()
		}
	}
	if n := bus.Subscribers(); n != 10 {
		b.Fatalf("%d subscribers kept, want 10", n)
	}
	bus.Close()
}
