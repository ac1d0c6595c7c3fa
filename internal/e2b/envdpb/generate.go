// Package envdpb holds the Go code generated from Corral's description of
// the envd services (process.proto, filesystem.proto) that the E2B facade
// serves. Regenerate it with `go generate ./internal/e2b/envdpb`, which
// needs protoc, protoc-gen-go and protoc-gen-connect-go on the PATH; the
// build does not.
package envdpb

//go:generate protoc --proto_path=. --go_out=. --go_opt=paths=source_relative --connect-go_out=. --connect-go_opt=paths=source_relative process.proto filesystem.proto
