// Package metrics is a small registry of counters, gauges and histograms
// written in the Prometheus text exposition format (version 0.0.4), by
// hand, without a client library.
//
// It owns the values and their formatting; it does not serve HTTP (package
// server does) and knows nothing of sandboxes. Every type is safe for
// concurrent use. A Registry is passed in where it is needed; there is no
// global one.
package metrics

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
)

// ContentType is the media type of WriteText's output.
const ContentType = "text/plain; version=0.0.4; charset=utf-8"

// DefaultBuckets are latency buckets in seconds, from 1 ms to 30 s: an exec
// round trip lands in the first ones, a cold create in the middle, an
// image build at the end.
var DefaultBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}

// Registry holds metric families by name. Registering a name twice panics:
// names are fixed at wiring time, so a clash is a programming error.
type Registry struct {
	mu   sync.Mutex
	fams map[string]family
}

// family is one named metric family: its HELP and TYPE lines and samples.
type family interface {
	write(ctx context.Context, w *bufio.Writer)
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry { return &Registry{fams: map[string]family{}} }

func (r *Registry) add(name string, f family) {
	if !validName(name) {
		panic(fmt.Sprintf("metrics: invalid metric name %q", name))
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.fams[name]; ok {
		panic(fmt.Sprintf("metrics: %q registered twice", name))
	}
	r.fams[name] = f
}

// WriteText writes every family, sorted by name, in the text exposition
// format. ctx bounds the families computed on scrape (GaugeFunc) and is
// what their functions are given.
func (r *Registry) WriteText(ctx context.Context, w io.Writer) error {
	return r.WriteFamilies(ctx, w, nil)
}

// WriteFamilies is WriteText for the families named in names only (every
// family when names is nil); names not registered are skipped.
func (r *Registry) WriteFamilies(ctx context.Context, w io.Writer, names []string) error {
	r.mu.Lock()
	if names == nil {
		names = slices.Collect(maps.Keys(r.fams))
	}
	names = slices.Sorted(slices.Values(names))
	var fams []family
	for _, n := range slices.Compact(names) {
		if f, ok := r.fams[n]; ok {
			fams = append(fams, f)
		}
	}
	r.mu.Unlock()
	bw := bufio.NewWriter(w)
	for _, f := range fams {
		f.write(ctx, bw)
	}
	return bw.Flush()
}

// desc is what every family has: name, help and label names.
type desc struct {
	name, help, typ string
	labels          []string
}

func newDesc(name, help, typ string, labels []string) desc {
	for _, l := range labels {
		if !validName(l) || strings.HasPrefix(l, "__") || l == "le" {
			panic(fmt.Sprintf("metrics: invalid label name %q on %s", l, name))
		}
	}
	return desc{name: name, help: help, typ: typ, labels: slices.Clone(labels)}
}

func (d desc) header(w *bufio.Writer) {
	fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s %s\n", d.name, escapeHelp(d.help), d.name, d.typ)
}

// key joins label values into a map key; it panics when their number is
// not the family's, which is a programming error.
func (d desc) key(values []string) string {
	if len(values) != len(d.labels) {
		panic(fmt.Sprintf("metrics: %s takes %d label values, got %d", d.name, len(d.labels), len(values)))
	}
	return strings.Join(values, "\xff")
}

// sample writes one line: name{labels,extra} value.
func (d desc) sample(w *bufio.Writer, suffix string, values []string, extraName, extraValue string, v float64) {
	w.WriteString(d.name)
	w.WriteString(suffix)
	if len(values) > 0 || extraName != "" {
		w.WriteByte('{')
		for i, l := range d.labels {
			if i > 0 {
				w.WriteByte(',')
			}
			fmt.Fprintf(w, "%s=\"%s\"", l, escapeLabel(values[i]))
		}
		if extraName != "" {
			if len(values) > 0 {
				w.WriteByte(',')
			}
			fmt.Fprintf(w, "%s=\"%s\"", extraName, extraValue)
		}
		w.WriteByte('}')
	}
	w.WriteByte(' ')
	w.WriteString(formatValue(v))
	w.WriteByte('\n')
}

// value is a float64 series (counter or gauge) keyed by label values.
type value struct {
	desc
	mu     sync.Mutex
	series map[string]*point
}

type point struct {
	values []string
	v      float64
}

func newValue(d desc) *value {
	v := &value{desc: d, series: map[string]*point{}}
	if len(d.labels) == 0 {
		v.series[""] = &point{}
	}
	return v
}

func (m *value) update(values []string, f func(float64) float64) {
	k := m.key(values)
	m.mu.Lock()
	defer m.mu.Unlock()
	p, ok := m.series[k]
	if !ok {
		p = &point{values: slices.Clone(values)}
		m.series[k] = p
	}
	p.v = f(p.v)
}

func (m *value) get(values []string) float64 {
	k := m.key(values)
	m.mu.Lock()
	defer m.mu.Unlock()
	if p, ok := m.series[k]; ok {
		return p.v
	}
	return 0
}

func (m *value) write(_ context.Context, w *bufio.Writer) {
	m.header(w)
	m.mu.Lock()
	for _, k := range slices.Sorted(maps.Keys(m.series)) {
		p := m.series[k]
		m.sample(w, "", p.values, "", "", p.v)
	}
	m.mu.Unlock()
}

// Counter is a monotonically increasing count, one per combination of
// label values.
type Counter struct{ v *value }

// Counter registers and returns a counter. By convention its name ends in
// _total. An unlabeled counter is written as 0 before its first Add.
func (r *Registry) Counter(name, help string, labels ...string) *Counter {
	c := &Counter{newValue(newDesc(name, help, "counter", labels))}
	r.add(name, c.v)
	return c
}

// Inc adds one to the series named by labelValues.
func (c *Counter) Inc(labelValues ...string) { c.Add(1, labelValues...) }

// Add adds delta, which must not be negative, to the series named by
// labelValues.
func (c *Counter) Add(delta float64, labelValues ...string) {
	if delta < 0 {
		panic(fmt.Sprintf("metrics: counter %s decreased", c.v.name))
	}
	c.v.update(labelValues, func(v float64) float64 { return v + delta })
}

// Value returns the current count of a series (0 when it has none).
func (c *Counter) Value(labelValues ...string) float64 { return c.v.get(labelValues) }

// Gauge is a value that goes up and down, one per combination of label
// values.
type Gauge struct{ v *value }

// Gauge registers and returns a gauge. An unlabeled gauge is written as 0
// before its first Set.
func (r *Registry) Gauge(name, help string, labels ...string) *Gauge {
	g := &Gauge{newValue(newDesc(name, help, "gauge", labels))}
	r.add(name, g.v)
	return g
}

// Set sets the series named by labelValues to v.
func (g *Gauge) Set(v float64, labelValues ...string) {
	g.v.update(labelValues, func(float64) float64 { return v })
}

// Add adds delta (which may be negative) to the series named by
// labelValues.
func (g *Gauge) Add(delta float64, labelValues ...string) {
	g.v.update(labelValues, func(v float64) float64 { return v + delta })
}

// Value returns the current value of a series (0 when it has none).
func (g *Gauge) Value(labelValues ...string) float64 { return g.v.get(labelValues) }

// Emit reports one sample of a GaugeFunc.
type Emit func(v float64, labelValues ...string)

// GaugeFunc registers a gauge family whose samples fn computes at every
// scrape, for values another component already holds (sandboxes by state,
// per-sandbox usage). fn must respect ctx, which carries the scrape's
// deadline, and may call emit from one goroutine only.
func (r *Registry) GaugeFunc(name, help string, labels []string, fn func(ctx context.Context, emit Emit)) {
	r.add(name, &gaugeFunc{desc: newDesc(name, help, "gauge", labels), fn: fn})
}

// CounterFunc is GaugeFunc for cumulative values another component counts
// (CPU time used): fn must report values that never decrease.
func (r *Registry) CounterFunc(name, help string, labels []string, fn func(ctx context.Context, emit Emit)) {
	r.add(name, &gaugeFunc{desc: newDesc(name, help, "counter", labels), fn: fn})
}

type gaugeFunc struct {
	desc
	fn func(context.Context, Emit)
}

func (g *gaugeFunc) write(ctx context.Context, w *bufio.Writer) {
	type sample struct {
		key    string
		values []string
		v      float64
	}
	var samples []sample
	g.fn(ctx, func(v float64, values ...string) {
		samples = append(samples, sample{g.key(values), slices.Clone(values), v})
	})
	sort.SliceStable(samples, func(i, j int) bool { return samples[i].key < samples[j].key })
	g.header(w)
	for _, s := range samples {
		g.sample(w, "", s.values, "", "", s.v)
	}
}

// Histogram counts observations in cumulative buckets, one set per
// combination of label values.
type Histogram struct {
	desc
	buckets []float64 // upper bounds, ascending, without +Inf
	mu      sync.Mutex
	series  map[string]*histPoint
}

type histPoint struct {
	values []string
	counts []uint64 // per bucket, not cumulative; last is +Inf
	sum    float64
	count  uint64
}

// Histogram registers and returns a histogram with the given bucket upper
// bounds (ascending; nil: DefaultBuckets). An unlabeled histogram is
// written with zero counts before its first observation.
func (r *Registry) Histogram(name, help string, buckets []float64, labels ...string) *Histogram {
	if buckets == nil {
		buckets = DefaultBuckets
	}
	if !slices.IsSorted(buckets) || len(buckets) == 0 {
		panic(fmt.Sprintf("metrics: buckets of %s must be ascending", name))
	}
	h := &Histogram{desc: newDesc(name, help, "histogram", labels), buckets: slices.Clone(buckets), series: map[string]*histPoint{}}
	if len(labels) == 0 {
		h.series[""] = &histPoint{counts: make([]uint64, len(buckets)+1)}
	}
	r.add(name, h)
	return h
}

// Observe records one value (seconds, for latencies) in the series named
// by labelValues.
func (h *Histogram) Observe(v float64, labelValues ...string) {
	k := h.key(labelValues)
	i := sort.SearchFloat64s(h.buckets, v) // first bound >= v: "le" is inclusive
	h.mu.Lock()
	defer h.mu.Unlock()
	p, ok := h.series[k]
	if !ok {
		p = &histPoint{values: slices.Clone(labelValues), counts: make([]uint64, len(h.buckets)+1)}
		h.series[k] = p
	}
	p.counts[i]++
	p.sum += v
	p.count++
}

// Count returns how many values a series has observed.
func (h *Histogram) Count(labelValues ...string) uint64 {
	k := h.key(labelValues)
	h.mu.Lock()
	defer h.mu.Unlock()
	if p, ok := h.series[k]; ok {
		return p.count
	}
	return 0
}

func (h *Histogram) write(_ context.Context, w *bufio.Writer) {
	h.header(w)
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, k := range slices.Sorted(maps.Keys(h.series)) {
		p := h.series[k]
		var cum uint64
		for i, c := range p.counts {
			cum += c
			le := "+Inf"
			if i < len(h.buckets) {
				le = formatValue(h.buckets[i])
			}
			h.sample(w, "_bucket", p.values, "le", le, float64(cum))
		}
		h.sample(w, "_sum", p.values, "", "", p.sum)
		h.sample(w, "_count", p.values, "", "", float64(p.count))
	}
}

// formatValue writes a float as the format expects: Go's shortest
// representation, with +Inf, -Inf and NaN spelled out.
func formatValue(v float64) string {
	switch {
	case math.IsInf(v, 1):
		return "+Inf"
	case math.IsInf(v, -1):
		return "-Inf"
	case math.IsNaN(v):
		return "NaN"
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}

// "label_value can be any sequence of UTF-8 characters, but the backslash
// (\), double-quote ("), and line feed (\n) characters have to be escaped
// as \\, \", and \n, respectively."
var labelEscaper = strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)

// "HELP lines may contain any sequence of UTF-8 characters (after the
// metric name), but the backslash and the line feed characters have to be
// escaped as \\ and \n, respectively."
var helpEscaper = strings.NewReplacer(`\`, `\\`, "\n", `\n`)

func escapeLabel(s string) string { return labelEscaper.Replace(s) }
func escapeHelp(s string) string  { return helpEscaper.Replace(s) }

// validName reports whether s matches [a-zA-Z_:][a-zA-Z0-9_:]*.
func validName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c == '_', c == ':':
		case c >= '0' && c <= '9' && i > 0:
		default:
			return false
		}
	}
	return true
}
