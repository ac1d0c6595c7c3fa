package corral

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
)

// TestPortClient: PortURL names the port route, and PortClient sends the
// key as X-API-Key, leaving the request's own Authorization alone.
func TestPortClient(t *testing.T) {
	var got *http.Request
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = r
		io.WriteString(w, "ok")
	}))
	defer srv.Close()
	for _, tt := range []struct {
		name, key string
	}{{"with key", "k1"}, {"without key", ""}} {
		t.Run(tt.name, func(t *testing.T) {
			c, err := New(srv.URL, tt.key)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			u := c.PortURL("sb1", 8080)
			if want := srv.URL + "/v1/sandboxes/sb1/ports/8080/"; u != want {
				t.Fatalf("PortURL = %q, want %q", u, want)
			}
			req, err := http.NewRequestWithContext(t.Context(), "GET", u+"a/b?x=1", nil)
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Authorization", "Bearer app-token")
			resp, err := c.PortClient().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if got.URL.RequestURI() != "/v1/sandboxes/sb1/ports/8080/a/b?x=1" || got.Header.Get("X-API-Key") != tt.key ||
				got.Header.Get("Authorization") != "Bearer app-token" {
				t.Errorf("request %s with headers %v", got.URL.RequestURI(), got.Header)
			}
			if req.Header.Get("X-API-Key") != "" {
				t.Error("PortClient changed the caller's request")
			}
		})
	}
}
