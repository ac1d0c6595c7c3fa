package interpreter

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"testing"
)

// BenchmarkPythonBare is one `1+1` round trip straight to an IPython
// kernel over ZMTP: the peer of BenchmarkPythonService.
func BenchmarkPythonBare(b *testing.B) {
	cfg := kernelConfig{language: LangPython, cwd: b.TempDir(), env: os.Environ(), dir: b.TempDir(), tools: hostTools(b)}
	k, err := startKernel(b.Context(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer k.kill()
	for b.Loop() {
		var text any
		if _, err := k.run(b.Context(), "1+1", nil, func(e Event) { text = e.Result["text"] }); err != nil || text != "2" {
			b.Fatalf("1+1: %v %v", text, err)
		}
	}
}

// BenchmarkPythonService is one `1+1` execution through the service's
// HTTP API on loopback, on the default context.
func BenchmarkPythonService(b *testing.B) {
	s := NewServer(Options{Tools: hostTools(b), Dir: b.TempDir(), Cwd: b.TempDir(), Env: os.Environ(), Defaults: []string{LangPython}})
	defer s.Close()
	url := serve(b, s)
	body, _ := json.Marshal(ExecuteRequest{Code: "1+1"})
	for b.Loop() {
		resp, err := http.Post(url+"/execute", "application/json", bytes.NewReader(body))
		if err != nil {
			b.Fatal(err)
		}
		out, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !bytes.Contains(out, []byte(`"text":"2"`)) {
			b.Fatalf("1+1: %s", out)
		}
	}
}
