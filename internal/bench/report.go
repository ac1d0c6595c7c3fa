package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// Scenario names, as they appear in the table and the JSON.
const (
	ScenarioExec    = "exec round trip"
	ScenarioCold    = "cold create to first output"
	ScenarioWarm    = "warm claim to first output"
	ScenarioBurst   = "burst create"
	ScenarioDensity = "density"
	ScenarioPeer    = "peer cold start"
	// ScenarioPeerExec is exec of /bin/true in a running container of a
	// peer OCI runtime (runc exec, runsc exec), interleaved with Corral's.
	ScenarioPeerExec = "peer exec round trip"
)

// Row is one measured (or unavailable) scenario.
type Row struct {
	Scenario string `json:"scenario"`
	// Runtime is the Corral runtime, or the peer's name for a peer row.
	Runtime string `json:"runtime"`
	N       int    `json:"n"`
	// P50MS and P99MS are nil when the scenario has no latency samples
	// (not available, or every attempt failed).
	P50MS *float64 `json:"p50_ms"`
	P99MS *float64 `json:"p99_ms"`
	// Extra is the scenario's other results in words, as the table shows them.
	Extra string `json:"extra,omitempty"`
	// Metrics are the same other results as numbers, for machines.
	Metrics map[string]float64 `json:"metrics,omitempty"`
}

// Report is the result of one Run.
type Report struct {
	Command   string    `json:"command"`
	Timestamp time.Time `json:"timestamp"`
	Rows      []Row     `json:"rows"`
	// Notes are remarks about the run: skipped peers, skipped columns.
	Notes []string `json:"notes,omitempty"`
}

// latencyRow returns a row with n, p50 and p99 of samples filled in.
func latencyRow(scenario, runtime string, samples []time.Duration) Row {
	r := Row{Scenario: scenario, Runtime: runtime, N: len(samples)}
	if len(samples) > 0 {
		p50, p99 := ms(Percentile(samples, 0.5)), ms(Percentile(samples, 0.99))
		r.P50MS, r.P99MS = &p50, &p99
	}
	return r
}

// PrintTable writes the report as an aligned text table, then its notes.
func PrintTable(w io.Writer, r Report) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SCENARIO\tRUNTIME\tN\tP50\tP99\tEXTRA")
	for _, row := range r.Rows {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\n", row.Scenario, row.Runtime, row.N,
			fmtMS(row.P50MS), fmtMS(row.P99MS), row.Extra)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("writing table: %w", err)
	}
	for _, n := range r.Notes {
		if _, err := fmt.Fprintf(w, "note: %s\n", n); err != nil {
			return fmt.Errorf("writing notes: %w", err)
		}
	}
	return nil
}

// PrintMarkdown writes the report as a Markdown table, for docs/BENCHMARKS.md.
func PrintMarkdown(w io.Writer, r Report) error {
	var b strings.Builder
	b.WriteString("| scenario | runtime | n | p50 | p99 | extra |\n| --- | --- | --- | --- | --- | --- |\n")
	for _, row := range r.Rows {
		fmt.Fprintf(&b, "| %s | %s | %d | %s | %s | %s |\n", row.Scenario, row.Runtime, row.N,
			fmtMS(row.P50MS), fmtMS(row.P99MS), strings.ReplaceAll(row.Extra, "|", `\|`))
	}
	for _, n := range r.Notes {
		fmt.Fprintf(&b, "\nNote: %s\n", n)
	}
	if _, err := io.WriteString(w, b.String()); err != nil {
		return fmt.Errorf("writing markdown: %w", err)
	}
	return nil
}

// PrintJSON writes the report as indented JSON.
func PrintJSON(w io.Writer, r Report) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(r); err != nil {
		return fmt.Errorf("writing json: %w", err)
	}
	return nil
}

func fmtMS(v *float64) string {
	if v == nil {
		return "-"
	}
	return fmt.Sprintf("%.2f ms", *v)
}

// fmtBytes renders n bytes in KiB or MiB.
func fmtBytes(n float64) string {
	if n >= 1<<20 || n <= -(1<<20) {
		return fmt.Sprintf("%.1f MiB", n/(1<<20))
	}
	return fmt.Sprintf("%.0f KiB", n/(1<<10))
}

// fmtCounts renders error counts by code in a stable order, "none" when empty.
func fmtCounts(counts map[string]int) string {
	if len(counts) == 0 {
		return "none"
	}
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%d", k, counts[k])
	}
	return strings.Join(parts, " ")
}
