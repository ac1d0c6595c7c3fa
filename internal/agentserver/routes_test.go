package agentserver

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

func TestRoutes(t *testing.T) {
	rt := newRoutes()
	for _, r := range []struct{ method, path string }{
		{"GET", "/health"}, {"GET", "/files"}, {"PUT", "/files"}, {"DELETE", "/files"},
		{"GET", "/processes"}, {"POST", "/processes"},
		{"GET", "/processes/{pid}"}, {"DELETE", "/processes/{pid}"}, {"POST", "/processes/{pid}/stdin"},
	} {
		rt.handle(r.method, r.path, func(w http.ResponseWriter, req *http.Request) {
			w.Header().Set("X-Route", r.method+" "+r.path)
			w.Header().Set("X-Pid", req.PathValue("pid"))
		})
	}
	for _, tc := range []struct {
		method, target      string
		code                int
		route, pid, allowed string
	}{
		{"GET", "/health", 200, "GET /health", "", ""},
		{"HEAD", "/health", 200, "GET /health", "", ""},
		{"PUT", "/files?path=/x", 200, "PUT /files", "", ""},
		{"POST", "/processes", 200, "POST /processes", "", ""},
		{"GET", "/processes/42", 200, "GET /processes/{pid}", "42", ""},
		{"DELETE", "/processes/42", 200, "DELETE /processes/{pid}", "42", ""},
		{"POST", "/processes/7/stdin", 200, "POST /processes/{pid}/stdin", "7", ""},
		{"POST", "/health", 405, "", "", "GET, HEAD"},
		{"PATCH", "/files", 405, "", "", "DELETE, GET, HEAD, PUT"},
		{"GET", "/processes/7/stdin", 405, "", "", "POST"},
		{"GET", "/nope", 404, "", "", ""},
		{"GET", "/processes/", 404, "", "", ""},
		{"GET", "/processes/7/nope", 404, "", "", ""},
		{"GET", "/processes/7/stdin/more", 404, "", "", ""},
		{"GET", "/health/", 404, "", "", ""},
	} {
		w := httptest.NewRecorder()
		rt.ServeHTTP(w, httptest.NewRequest(tc.method, tc.target, nil))
		h := w.Result().Header
		if w.Code != tc.code || h.Get("X-Route") != tc.route || h.Get("X-Pid") != tc.pid || h.Get("Allow") != tc.allowed {
			t.Errorf("%s %s: %d route %q pid %q allow %q; want %d %q %q %q", tc.method, tc.target,
				w.Code, h.Get("X-Route"), h.Get("X-Pid"), h.Get("Allow"), tc.code, tc.route, tc.pid, tc.allowed)
		}
	}
}

// BenchmarkNewServer measures building the agent's server, which every
// sandbox start waits for.
func BenchmarkNewServer(b *testing.B) {
	for b.Loop() {
		NewServer(Options{}).Close()
	}
}
