package e2b

import (
	"bytes"
	"encoding/hex"
	"io"
	"net/http"
	"testing"
)

// BenchmarkEnvdStat measures one unary envd call in the binary encoding,
// as the Python SDK makes it: HTTP, authentication, decoding, the agent's
// stat and encoding the answer.
func BenchmarkEnvdStat(b *testing.B) {
	e := newEnv(b)
	req, _ := hex.DecodeString("0a052f726f6f74") // StatRequest{path: "/root"}
	for b.Loop() {
		resp := e.envd("POST", "/filesystem.Filesystem/Stat", "application/proto", bytes.NewReader(req), nil)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || len(body) == 0 {
			b.Fatalf("stat: HTTP %d %q", resp.StatusCode, body)
		}
	}
}

// BenchmarkEnvdProcessStart measures a process start with its output
// stream in JSON, as the JavaScript SDK's commands.run makes it.
func BenchmarkEnvdProcessStart(b *testing.B) {
	e := newEnv(b)
	body := `{"process":{"cmd":"/bin/sh","args":["-c","echo hi"]}}`
	for b.Loop() {
		msgs, end := e.streamJSON("process.Process/Start", body, nil)
		if end["error"] != nil || len(msgs) < 3 {
			b.Fatalf("start: %v %v", msgs, end)
		}
	}
}
