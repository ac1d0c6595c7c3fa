package mounts

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"

	"github.com/corralrun/corral/internal/sandbox"
)

// BenchmarkPrepare times Prepare and Release of one mount in each mode;
// cow10k's source holds 10,000 files, which an overlay does not read at
// mount time.
//
//	go test -run '^$' -bench Prepare -benchtime 200x ./internal/mounts
func BenchmarkPrepare(b *testing.B) {
	e := newEnv(b)
	small := e.dir(b, "small", 1000, 1000)
	many := e.dir(b, "many", 1000, 1000)
	for i := range 10000 {
		if err := os.WriteFile(filepath.Join(many, strconv.Itoa(i)), nil, 0o644); err != nil {
			b.Fatal(err)
		}
	}
	syscall.Sync() // the files written back before the first sample
	for _, bc := range []struct {
		name string
		m    sandbox.Mount
	}{
		{"ro", sandbox.Mount{Source: small, Target: "/w", Mode: sandbox.MountReadOnly}},
		{"rw", sandbox.Mount{Source: small, Target: "/w", Mode: sandbox.MountReadWrite}},
		{"cow", sandbox.Mount{Source: small, Target: "/w", Mode: sandbox.MountCopyOnWrite}},
		{"cow10k", sandbox.Mount{Source: many, Target: "/w", Mode: sandbox.MountCopyOnWrite}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			ctx := context.Background()
			for i := 0; i < b.N; i++ {
				id := "b" + strconv.Itoa(i)
				if _, err := e.m.Prepare(ctx, id, []sandbox.Mount{bc.m}, sandbox.MountOptions{Root: sandboxRoot, User: sandboxRoot}); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				if err := e.m.Release(ctx, id); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
		})
	}
}
