package undo

import (
	"context"
	"errors"
	"testing"
)

func TestUndoRunsNewestFirstAndJoinsErrors(t *testing.T) {
	var order []int
	var s Stack
	errTwo := errors.New("two")
	s.Add(func(context.Context) error { order = append(order, 1); return nil })
	s.Add(func(context.Context) error { order = append(order, 2); return errTwo })
	s.Add(func(context.Context) error { order = append(order, 3); return nil })
	err := s.Undo(context.Background())
	if !errors.Is(err, errTwo) {
		t.Fatalf("Undo = %v, want it to carry %v", err, errTwo)
	}
	if len(order) != 3 || order[0] != 3 || order[1] != 2 || order[2] != 1 {
		t.Fatalf("releases ran in order %v, want [3 2 1]", order)
	}
	if err := s.Undo(context.Background()); err != nil || len(order) != 3 {
		t.Fatalf("a second Undo ran releases again (err %v, order %v)", err, order)
	}
}

func TestUndoOutlivesTheCallersContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var s Stack
	var sawErr error
	s.Add(func(ctx context.Context) error { sawErr = ctx.Err(); return nil })
	if err := s.Undo(ctx); err != nil {
		t.Fatal(err)
	}
	if sawErr != nil {
		t.Fatalf("release saw a context that had ended: %v", sawErr)
	}
}

func TestOnError(t *testing.T) {
	failing := func() (err error) {
		var s Stack
		defer s.OnError(context.Background(), &err)
		s.Add(func(context.Context) error { return errors.New("release failed") })
		return errors.New("step failed")
	}
	err := failing()
	if err == nil || err.Error() != "step failed; undoing: release failed" {
		t.Fatalf("err = %v", err)
	}

	ran := false
	succeeding := func() (err error) {
		var s Stack
		defer s.OnError(context.Background(), &err)
		s.Add(func(context.Context) error { ran = true; return nil })
		return nil
	}
	if err := succeeding(); err != nil || ran {
		t.Fatalf("a successful function ran its releases (err %v, ran %v)", err, ran)
	}
}
