package bench

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/go-cmp/cmp"

	corral "github.com/corralrun/corral/sdk"
)

// The burst counts only 503 with Retry-After as a refusal; any other
// answer to a create fails the scenario and is counted by status and code.
func TestBurstCountsAnswers(t *testing.T) {
	answers := []struct {
		status int
		code   string
		retry  bool
	}{
		{503, "busy", true}, {503, "busy", true}, {503, "busy", true},
		{503, "busy", false}, {500, "internal", false}, {429, "resource_exhausted", true},
	}
	var next atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != "POST" || r.URL.Path != "/v1/sandboxes" {
			http.NotFound(w, r)
			return
		}
		a := answers[next.Add(1)-1]
		if a.retry {
			w.Header().Set("Retry-After", "1")
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(a.status)
		fmt.Fprintf(w, `{"error":{"code":%q,"message":"no"}}`, a.code)
	}))
	defer srv.Close()
	c, err := corral.New(srv.URL, "")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	rep, err := Run(t.Context(), Options{Runtime: "runc", Burst: len(answers)}, c)
	if err == nil || !strings.Contains(err.Error(), "3 of 6 creates answered neither 201 nor 503 with Retry-After") {
		t.Errorf("Run: %v, want the 3 other answers as an error", err)
	}
	if len(rep.Rows) != 1 {
		t.Fatalf("rows: %+v", rep.Rows)
	}
	row := rep.Rows[0]
	want := map[string]float64{"created": 0, "refused": 3, "other": 3, "creates_per_s": 0, "exec_errors": 0}
	delete(row.Metrics, "wall_s")
	if diff := cmp.Diff(want, row.Metrics); diff != "" {
		t.Errorf("metrics (-want +got):\n%s", diff)
	}
	if !strings.Contains(row.Extra, "429_resource_exhausted=1 500_internal=1 503_busy=1") {
		t.Errorf("extra %q does not count the other answers", row.Extra)
	}
}
