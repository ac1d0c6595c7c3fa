package metrics

import (
	"bufio"
	"fmt"
	"io"
	"maps"
	"strconv"
	"strings"
)

// Sample is one line of the text format: a name, its labels and a value.
type Sample struct {
	Name   string
	Labels map[string]string
	Value  float64
}

// Scrape is a parsed exposition: the samples in order and the TYPE of each
// family.
type Scrape struct {
	Samples []Sample
	Types   map[string]string
}

// Parse reads the text exposition format as WriteText writes it (no
// timestamps), checking that every sample belongs to a family declared by
// a TYPE line before it. It exists so that tests, and a curious operator's
// tooling, can read /metrics back without a client library.
func Parse(r io.Reader) (*Scrape, error) {
	s := &Scrape{Types: map[string]string{}}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		switch {
		case line == "":
			continue
		case strings.HasPrefix(line, "# TYPE "):
			f := strings.Fields(line)
			if len(f) != 4 {
				return nil, fmt.Errorf("line %d: malformed TYPE line", n)
			}
			s.Types[f[2]] = f[3]
			continue
		case strings.HasPrefix(line, "#"):
			continue
		}
		sm, err := parseSample(line)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		if _, ok := s.Types[familyOf(sm.Name, s.Types)]; !ok {
			return nil, fmt.Errorf("line %d: sample %s has no TYPE line before it", n, sm.Name)
		}
		s.Samples = append(s.Samples, sm)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return s, nil
}

// familyOf maps a histogram's _bucket, _sum and _count samples to the
// family name.
func familyOf(name string, types map[string]string) string {
	for _, suf := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suf); ok && types[base] == "histogram" {
			return base
		}
	}
	return name
}

func parseSample(line string) (Sample, error) {
	sm := Sample{Labels: map[string]string{}}
	i := strings.IndexAny(line, "{ ")
	if i <= 0 {
		return sm, fmt.Errorf("malformed sample %q", line)
	}
	sm.Name = line[:i]
	if !validName(sm.Name) {
		return sm, fmt.Errorf("invalid metric name %q", sm.Name)
	}
	rest := line[i:]
	if rest[0] == '{' {
		rest = rest[1:]
		for {
			if strings.HasPrefix(rest, "}") {
				rest = rest[1:]
				break
			}
			name, after, ok := strings.Cut(rest, `="`)
			if !ok || !validName(name) {
				return sm, fmt.Errorf("malformed labels in %q", line)
			}
			val, after, err := unquoteLabel(after)
			if err != nil {
				return sm, fmt.Errorf("%w in %q", err, line)
			}
			sm.Labels[name] = val
			rest = strings.TrimPrefix(after, ",")
		}
	}
	v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
	if err != nil {
		return sm, fmt.Errorf("malformed value in %q", line)
	}
	sm.Value = v
	return sm, nil
}

// unquoteLabel reads an escaped label value up to its closing quote.
func unquoteLabel(s string) (val, rest string, err error) {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '"':
			return b.String(), s[i+1:], nil
		case '\\':
			if i+1 == len(s) {
				return "", "", fmt.Errorf("dangling escape")
			}
			i++
			switch s[i] {
			case 'n':
				b.WriteByte('\n')
			case '\\', '"':
				b.WriteByte(s[i])
			default:
				return "", "", fmt.Errorf("unknown escape \\%c", s[i])
			}
		default:
			b.WriteByte(c)
		}
	}
	return "", "", fmt.Errorf("unterminated label value")
}

// Get returns the value of the first sample named name whose labels
// include every pair in labels ("k1", "v1", "k2", "v2", ...).
func (s *Scrape) Get(name string, labels ...string) (float64, bool) {
	for _, sm := range s.Find(name, labels...) {
		return sm.Value, true
	}
	return 0, false
}

// Find returns the samples named name whose labels include every pair in
// labels.
func (s *Scrape) Find(name string, labels ...string) []Sample {
	var out []Sample
	for _, sm := range s.Samples {
		if sm.Name != name {
			continue
		}
		ok := true
		for i := 0; i+1 < len(labels); i += 2 {
			if sm.Labels[labels[i]] != labels[i+1] {
				ok = false
				break
			}
		}
		if ok {
			out = append(out, Sample{Name: sm.Name, Labels: maps.Clone(sm.Labels), Value: sm.Value})
		}
	}
	return out
}
