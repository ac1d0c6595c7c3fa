package server

import (
	"time"

	"github.com/corralrun/corral/internal/sandbox"
)

// fields converts the numeric fields of a request to the Manager's units,
// each checked against its documented range (sandbox.Range) before it is
// converted, and keeps the first refusal in err.
type fields struct{ err error }

// opt converts v, where 0 means omitted and stays 0.
func (f *fields) opt(r sandbox.Range, v int64) int64 {
	if v == 0 {
		return 0
	}
	return f.req(r, v)
}

// req converts v, where 0 is a value like any other.
func (f *fields) req(r sandbox.Range, v int64) int64 {
	n, err := r.Convert(v)
	if f.err == nil {
		f.err = err
	}
	return n
}

// cpus converts a number of CPUs to millicpus (0: omitted).
func (f *fields) cpus(v float64) int64 {
	if v == 0 {
		return 0
	}
	n, err := sandbox.RangeCPUs.ConvertFloat(v)
	if f.err == nil {
		f.err = err
	}
	return n
}

// seconds converts a number of seconds to a duration; nil stays nil.
func (f *fields) seconds(r sandbox.Range, v *int64) *time.Duration {
	if v == nil {
		return nil
	}
	d := time.Duration(f.req(r, *v))
	return &d
}
