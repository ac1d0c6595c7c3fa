package ociimage

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/corralrun/corral/internal/errdefs"
)

// applyAll applies the layers in order onto dir.
func applyAll(ctx context.Context, dir string, layers ...[]byte) error {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	buf := make([]byte, 32<<10)
	for i, l := range layers {
		if err := applyLayer(ctx, root, bytes.NewReader(l), buf); err != nil {
			return fmt.Errorf("layer %d: %w", i+1, err)
		}
	}
	return nil
}

func TestApplyLayers(t *testing.T) {
	tests := []struct {
		name   string
		layers [][]member
		want   map[string]string
	}{
		{
			name: "whiteout deletes a lower file and a lower directory",
			layers: [][]member{
				{dir("etc"), file("etc/a", "a"), file("etc/b", "b"), dir("var/cache"), file("var/cache/x", "x")},
				{file("etc/.wh.a", ""), file("var/.wh.cache", "")},
			},
			want: map[string]string{"etc": "dir", "etc/b": "file:b", "var": "dir"},
		},
		{
			name: "opaque directory hides lower content but keeps its own",
			layers: [][]member{
				{dir("app"), file("app/old", "old"), dir("app/sub"), file("app/sub/deep", "deep"), file("keep", "k")},
				{dir("app"), file("app/.wh..wh..opq", ""), file("app/new", "new")},
			},
			want: map[string]string{"app": "dir", "app/new": "file:new", "keep": "file:k"},
		},
		{
			name: "opaque marker after the layer's own entries keeps them",
			layers: [][]member{
				{dir("app"), file("app/old", "old"), dir("app/sub"), file("app/sub/lower", "l")},
				{file("app/sub/upper", "u"), file("app/new", "new"), file("app/.wh..wh..opq", "")},
			},
			want: map[string]string{"app": "dir", "app/new": "file:new", "app/sub": "dir", "app/sub/upper": "file:u"},
		},
		{
			name: "whiteout does not hide what its own layer wrote",
			layers: [][]member{
				{file("f", "lower")},
				{file("f", "upper"), file(".wh.f", "")},
			},
			want: map[string]string{"f": "file:upper"},
		},
		{
			name: "whiteout of a missing file is a no-op",
			layers: [][]member{
				{file("a", "a")},
				{file("nowhere/.wh.x", ""), file(".wh.missing", "")},
			},
			want: map[string]string{"a": "file:a"},
		},
		{
			name: "file replaces directory and directory replaces file",
			layers: [][]member{
				{dir("d"), file("d/x", "x"), file("f", "f")},
				{file("d", "now a file"), dir("f"), file("f/y", "y")},
			},
			want: map[string]string{"d": "file:now a file", "f": "dir", "f/y": "file:y"},
		},
		{
			name: "absolute names land inside",
			layers: [][]member{
				{file("/etc/hostname", "h"), symlink("/bin", "/usr/bin")},
			},
			want: map[string]string{"etc": "dir", "etc/hostname": "file:h", "bin": "link:/usr/bin"},
		},
		{
			name: "hard link to a lower file",
			layers: [][]member{
				{file("a", "data")},
				{hardlink("b", "a")},
			},
			want: map[string]string{"a": "file:data", "b": "file:data"},
		},
		{
			name: "opaque marker through a symlink removes only the link",
			layers: [][]member{
				{dir("real"), file("real/x", "x"), symlink("l", "real")},
				{file("l/.wh..wh..opq", "")},
			},
			want: map[string]string{"real": "dir", "real/x": "file:x"},
		},
		{
			name: "aufs metadata is ignored",
			layers: [][]member{
				{file("a", "a"), file(".wh..wh.plnk/1", ""), file(".wh..wh.aufs", "")},
			},
			want: map[string]string{"a": "file:a"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			parent, root := sandboxDirs(t)
			var layers [][]byte
			for _, l := range tc.layers {
				layers = append(layers, tarBytes(t, l...))
			}
			if err := applyAll(t.Context(), root, layers...); err != nil {
				t.Fatalf("applying: %v", err)
			}
			if diff := cmp.Diff(tc.want, tree(t, root)); diff != "" {
				t.Errorf("tree (-want +got):\n%s", diff)
			}
			checkOutside(t, parent)
		})
	}
}

func TestApplyRefusesEscapes(t *testing.T) {
	tests := []struct {
		name string
		// layers get "OUT" replaced by the absolute path of the outside
		// directory, so a write that follows a link really would land
		// next to the sentinel.
		layers  [][]member
		wantMsg string
	}{
		{
			name:    "dot-dot name",
			layers:  [][]member{{file("a/../../outside/evil", "x")}},
			wantMsg: `entry "a/../../outside/evil": path escapes the rootfs`,
		},
		{
			name:    "write through an absolute symlink",
			layers:  [][]member{{symlink("l", "OUT"), file("l/evil", "x")}},
			wantMsg: `entry "l/evil": path escapes the rootfs through symlink "l"`,
		},
		{
			name:    "write through a relative symlink that climbs out",
			layers:  [][]member{{symlink("up", "../outside"), file("up/evil", "x")}},
			wantMsg: `entry "up/evil": path escapes the rootfs through symlink "up" -> "../outside"`,
		},
		{
			name:    "write through a symlink from a lower layer",
			layers:  [][]member{{symlink("etc", "OUT")}, {file("etc/passwd", "root::0:0")}},
			wantMsg: `layer 2: entry "etc/passwd": path escapes the rootfs through symlink "etc"`,
		},
		{
			name:    "hard link out by name",
			layers:  [][]member{{hardlink("hl", "../outside/sentinel")}},
			wantMsg: `entry "hl": hard link target "../outside/sentinel": path escapes the rootfs`,
		},
		{
			name:    "hard link out through a symlink",
			layers:  [][]member{{symlink("l", "OUT"), hardlink("hl", "l/sentinel")}},
			wantMsg: `entry "hl": path escapes the rootfs through symlink "l"`,
		},
		{
			name:    "whiteout through a symlink",
			layers:  [][]member{{symlink("l", "OUT")}, {file("l/.wh.sentinel", "")}},
			wantMsg: `entry "l/.wh.sentinel": path escapes the rootfs through symlink "l"`,
		},
		{
			name:    "whiteout of dot-dot",
			layers:  [][]member{{file(".wh...", "")}},
			wantMsg: `whiteout names no file`,
		},
		{
			name:    "file replacing the root",
			layers:  [][]member{{file(".", "x")}},
			wantMsg: `would replace the rootfs directory itself`,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			parent, root := sandboxDirs(t)
			out := filepath.Join(parent, "outside")
			var layers [][]byte
			for _, l := range tc.layers {
				for i := range l {
					l[i].link = strings.ReplaceAll(l[i].link, "OUT", out)
				}
				layers = append(layers, tarBytes(t, l...))
			}
			err := applyAll(t.Context(), root, layers...)
			if err == nil {
				t.Fatal("applying succeeded, want an error")
			}
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("error %v does not wrap ErrInvalidArgument", err)
			}
			if !strings.Contains(err.Error(), tc.wantMsg) {
				t.Errorf("error %q does not contain %q", err, tc.wantMsg)
			}
			checkOutside(t, parent)
		})
	}
}

func TestApplyCanceled(t *testing.T) {
	_, root := sandboxDirs(t)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	err := applyAll(ctx, root, tarBytes(t, file("a", "a")))
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("error = %v, want context.Canceled", err)
	}
}

// FuzzApplyLayer checks that no tar input, applied twice in a row (so that
// the second pass meets what the first left), writes outside the rootfs.
func FuzzApplyLayer(f *testing.F) {
	seeds := [][]member{
		{file("a/../../outside/evil", "x")},
		{symlink("l", "/"), file("l/tmp/evil", "x")},
		{symlink("up", "../outside"), file("up/evil", "x"), file("up/.wh.sentinel", "")},
		{hardlink("hl", "../outside/sentinel"), dir("d"), file("d/.wh..wh..opq", "")},
		{symlink("d", ".."), file("d/.wh..wh..opq", ""), file(".wh.d", "")},
		{dir("x"), file("x/f", "f"), hardlink("x/g", "x/f"), symlink("x/s", "../x/f")},
	}
	for _, s := range seeds {
		f.Add(tarBytes(f, s...))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		parent, root := sandboxDirs(t)
		_ = applyAll(t.Context(), root, data, data)
		checkOutside(t, parent)
	})
}

// FuzzApplyEntries builds well-formed layers from a script of entries, one
// per line: a type letter (f file, d directory, l symlink, h hard link),
// a name and, for links, a target in which "OUT" stands for the absolute
// path of the directory next to the rootfs. Byte-level fuzzing of tar
// rarely gets past the header checksum; this reaches the applier with
// arbitrary names and links. The script is applied as two layers, the
// second made of its lines in reverse order.
func FuzzApplyEntries(f *testing.F) {
	for _, s := range []string{
		"l a OUT\nf a/evil\n",
		"l a ../outside\nf a/evil\nh b a/sentinel\n",
		"d x\nl x/y ../..\nf x/y/outside/evil\nf x/.wh.y\nf x/y/.wh..wh..opq\n",
		"l up ..\nh hl up/outside/sentinel\nf up/.wh.outside\n",
		"l a b\nl b a\nf a/c\nd a/../../outside\n",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, script string) {
		parent, root := sandboxDirs(t)
		out := filepath.Join(parent, "outside")
		lines := strings.Split(script, "\n")
		var members []member
		for _, line := range lines {
			fields := strings.SplitN(line, " ", 3)
			if len(fields) < 2 || fields[0] == "" {
				continue
			}
			m := member{name: fields[1], mode: 0o755}
			if len(fields) == 3 {
				m.link = strings.ReplaceAll(fields[2], "OUT", out)
			}
			switch fields[0][0] % 4 {
			case 0:
				m.typ, m.body = tar.TypeReg, "x"
			case 1:
				m.typ = tar.TypeDir
			case 2:
				m.typ = tar.TypeSymlink
			case 3:
				m.typ = tar.TypeLink
			}
			members = append(members, m)
		}
		first, ok := lenientTar(members)
		if !ok {
			return
		}
		slices.Reverse(members)
		second, _ := lenientTar(members)
		_ = applyAll(t.Context(), root, first, second)
		checkOutside(t, parent)
	})
}

// lenientTar is tarBytes for fuzzing: it reports failure instead of
// failing the test.
func lenientTar(members []member) ([]byte, bool) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, m := range members {
		hdr := &tar.Header{Name: m.name, Linkname: m.link, Typeflag: m.typ, Mode: m.mode, Size: int64(len(m.body)), ModTime: testTime, Format: tar.FormatPAX}
		if tw.WriteHeader(hdr) != nil {
			return nil, false
		}
		if _, err := tw.Write([]byte(m.body)); err != nil {
			return nil, false
		}
	}
	return buf.Bytes(), tw.Close() == nil
}
