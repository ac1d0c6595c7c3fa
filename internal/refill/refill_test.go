package refill

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/corralrun/corral/internal/testutil"
)

// set is a set of items to keep at want, counting the rounds that filled
// it.
type set struct {
	mu     sync.Mutex
	have   int
	want   int
	made   int
	fail   error
	inNext chan struct{} // when set, next waits for it to be closed
}

func (s *set) next() (bool, error) {
	if s.inNext != nil {
		<-s.inNext
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		return false, s.fail
	}
	if s.have >= s.want {
		return false, nil
	}
	s.have++
	s.made++
	return true, nil
}

func (s *set) take() {
	s.mu.Lock()
	s.have--
	s.mu.Unlock()
}

func (s *set) count() (have, made int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.have, s.made
}

// counted wraps next to count its calls.
func counted(next func() (bool, error)) (func() (bool, error), *atomic.Int32) {
	var calls atomic.Int32
	return func() (bool, error) {
		calls.Add(1)
		return next()
	}, &calls
}

func TestRunFills(t *testing.T) {
	s := &set{want: 3}
	r := New(time.Hour, s.next)
	defer r.Close()
	r.Run()
	if have, made := s.count(); have != 3 || made != 3 {
		t.Fatalf("after Run: have %d, made %d; want 3 and 3", have, made)
	}
}

// A take schedules a round that runs after the delay, not before.
func TestScheduleWaitsForTheDelay(t *testing.T) {
	s := &set{want: 2, have: 2}
	r := New(50*time.Millisecond, s.next)
	defer r.Close()
	s.take()
	start := time.Now()
	r.Schedule()
	r.Schedule() // one round for both
	testutil.WaitFor(t, func() bool { have, _ := s.count(); return have == 2 })
	if d := time.Since(start); d < 50*time.Millisecond {
		t.Errorf("round after %s, before the delay", d)
	}
}

// A take while a round runs, after the round last looked, gets a round of
// its own.
func TestScheduleDuringARound(t *testing.T) {
	s := &set{want: 1, inNext: make(chan struct{})}
	next, calls := counted(s.next)
	r := New(time.Millisecond, next)
	defer r.Close()
	done := make(chan struct{})
	go func() { r.Run(); close(done) }()
	testutil.WaitFor(t, func() bool { return calls.Load() == 1 })
	r.Schedule()
	time.Sleep(20 * time.Millisecond) // the timer goes off while the round runs
	close(s.inNext)
	<-done
	s.take()
	testutil.WaitFor(t, func() bool { have, _ := s.count(); return have == 1 })
}

// A failure ends the round; nothing runs until the next Schedule.
func TestFailureEndsTheRound(t *testing.T) {
	s := &set{want: 2, fail: errors.New("no room")}
	r := New(time.Millisecond, s.next)
	defer r.Close()
	r.Run()
	s.mu.Lock()
	s.fail = nil
	s.mu.Unlock()
	time.Sleep(20 * time.Millisecond)
	if have, _ := s.count(); have != 0 {
		t.Fatalf("have %d after a failed round, want 0", have)
	}
	r.Schedule()
	testutil.WaitFor(t, func() bool { have, _ := s.count(); return have == 2 })
}

// Close waits for a running round and stops every later one; Stop does
// the first and lets Schedule start rounds again.
func TestStopAndClose(t *testing.T) {
	s := &set{want: 1, inNext: make(chan struct{})}
	next, calls := counted(s.next)
	r := New(time.Millisecond, next)
	go r.Run()
	testutil.WaitFor(t, func() bool { return calls.Load() == 1 })
	stopped := make(chan struct{})
	go func() { r.Stop(); close(stopped) }()
	select {
	case <-stopped:
		t.Fatal("Stop returned while a round ran")
	case <-time.After(20 * time.Millisecond):
	}
	close(s.inNext)
	<-stopped
	s.take()
	r.Schedule()
	testutil.WaitFor(t, func() bool { have, _ := s.count(); return have == 1 })

	r.Close()
	s.take()
	r.Schedule()
	r.Run()
	time.Sleep(20 * time.Millisecond)
	if have, _ := s.count(); have != 0 {
		t.Errorf("a round ran after Close: have %d", have)
	}
}
