// Package undo is how Corral rolls back partial work: a function that
// acquires several resources registers, right after each one, how to
// release it; on failure the releases run newest first, and on success
// they are dropped, so what was acquired passes to its owner.
//
//	var u undo.Stack
//	defer u.OnError(ctx, &err)
//	ns, err := makeNetNS()
//	if err != nil {
//		return err
//	}
//	u.Add(func(context.Context) error { return removeNetNS(ns) })
//
// Register a release only once its acquisition succeeded, so that a
// release never sees a half-made resource.
package undo

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Timeout bounds the releases of one Undo: they run under a context of
// their own, because the caller's may be what ended the work.
const Timeout = time.Minute

// Stack holds the releases of the work done so far. The zero Stack is
// ready to use. A Stack is not safe for concurrent use.
type Stack struct {
	fns []func(context.Context) error
}

// Add registers fn as the release of what was just acquired.
func (s *Stack) Add(fn func(context.Context) error) {
	s.fns = append(s.fns, fn)
}

// Keep drops every registered release: the work succeeded.
func (s *Stack) Keep() {
	s.fns = nil
}

// Undo runs the registered releases, newest first, each one even when an
// earlier one failed, and returns their errors joined. It keeps ctx's
// values but not its cancellation, and gives up after Timeout. The Stack
// is empty afterwards.
func (s *Stack) Undo(ctx context.Context) error {
	fns := s.fns
	s.fns = nil
	if len(fns) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), Timeout)
	defer cancel()
	var errs []error
	for i := len(fns) - 1; i >= 0; i-- {
		if err := fns[i](ctx); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// OnError is meant to be deferred with the address of the function's
// named error: when *errp is set, it runs Undo and adds a failed
// release's error to *errp (errors.Is still finds the original error).
// When *errp is nil it drops the releases, as Keep does.
func (s *Stack) OnError(ctx context.Context, errp *error) {
	if *errp == nil {
		s.Keep()
		return
	}
	if err := s.Undo(ctx); err != nil {
		*errp = fmt.Errorf("%w; undoing: %w", *errp, err)
	}
}
