package ocirt

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestWriteAll checks the rollback of writeAll on plain files: a write
// that fails (its file is a directory) leaves every file with its earlier
// value, and undo after a success does the same.
func TestWriteAll(t *testing.T) {
	tests := []struct {
		name    string
		fail    string // the file made a directory, which cannot be written
		useUndo bool
	}{
		{name: "first write fails", fail: "a"},
		{name: "middle write fails", fail: "b"},
		{name: "last write fails", fail: "c"},
		{name: "undo after success", useUndo: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			before := map[string]string{"a": "1", "b": "max", "c": "-1"}
			for name, v := range before {
				if name == tt.fail {
					if err := os.Mkdir(filepath.Join(dir, name), 0o755); err != nil {
						t.Fatal(err)
					}
					delete(before, name)
					continue
				}
				if err := os.WriteFile(filepath.Join(dir, name), []byte(v+"\n"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			var writes []cgroupWrite
			for _, name := range []string{"a", "b", "c"} {
				writes = append(writes, cgroupWrite{filepath.Join(dir, name), "new-" + name})
			}
			undo, err := writeAll(writes)
			switch {
			case tt.useUndo && err != nil:
				t.Fatal(err)
			case tt.useUndo:
				if got := readAll(t, dir, before); got["a"] != "new-a" || got["c"] != "new-c" {
					t.Fatalf("after writeAll: %v", got)
				}
				if err := undo(); err != nil {
					t.Fatal(err)
				}
			case err == nil:
				t.Fatal("writeAll succeeded with a directory to write")
			case !strings.Contains(err.Error(), "setting "+tt.fail):
				t.Errorf("error %q does not name %s", err, tt.fail)
			}
			if diff := cmp.Diff(before, readAll(t, dir, before)); diff != "" {
				t.Errorf("files after the rollback (-want +got):\n%s", diff)
			}
		})
	}
}

func readAll(t *testing.T, dir string, names map[string]string) map[string]string {
	t.Helper()
	got := map[string]string{}
	for name := range names {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		got[name] = strings.TrimSpace(string(b))
	}
	return got
}
