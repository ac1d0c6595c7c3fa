package snapshotdir

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/corralrun/corral/internal/errdefs"
)

// Names inside a snapshot directory.
const (
	ManifestName = "manifest.json"
	ChangesName  = "files.tar"
	MemoryDir    = "memory"
)

// Temporary directories of snapshots being written or removed start with
// these prefixes; final names never do (callers validate names).
const (
	tmpPrefix = ".tmp-"
	delPrefix = ".del-"
)

// Manifest lists the files of a snapshot with their checksums, and holds
// the caller's record of it.
type Manifest struct {
	Version int `json:"version"`
	// Files maps slash-separated paths relative to the snapshot directory
	// to their size and checksum; every regular file but the manifest.
	Files map[string]Sum `json:"files"`
	// Info is the caller's record, opaque here.
	Info json.RawMessage `json:"info,omitempty"`
}

// Sum is one file's size and SHA-256.
type Sum struct {
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
}

// TempDir makes an empty directory under parent in which snapshot name
// is written; Publish gives it its final name, Clean removes it if the
// process dies first.
func TempDir(parent, name string) (string, error) {
	if err := os.MkdirAll(parent, 0o700); err != nil {
		return "", fmt.Errorf("creating snapshot directory: %w", err)
	}
	dir, err := os.MkdirTemp(parent, tmpPrefix+name+"-")
	if err != nil {
		return "", fmt.Errorf("creating snapshot directory: %w", err)
	}
	return dir, nil
}

// Seal checksums and syncs every file and directory under dir, then
// writes the manifest (with info) and syncs it and dir. It reads every
// byte once: about the cost of SHA-256 over the snapshot's size.
func Seal(dir string, info any) (Manifest, error) {
	raw, err := json.Marshal(info)
	if err != nil {
		return Manifest{}, fmt.Errorf("encoding snapshot record: %w", err)
	}
	m := Manifest{Version: 1, Files: make(map[string]Sum), Info: raw}
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		switch {
		case d.IsDir():
			return syncPath(p)
		case !d.Type().IsRegular():
			return fmt.Errorf("%s is not a regular file", p)
		case rel == ManifestName:
			return fmt.Errorf("%s exists before sealing", p)
		}
		sum, err := hashFile(p, true)
		if err != nil {
			return err
		}
		m.Files[filepath.ToSlash(rel)] = sum
		return nil
	})
	if err != nil {
		return Manifest{}, fmt.Errorf("sealing snapshot %s: %w", dir, err)
	}
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return Manifest{}, err
	}
	if err := writeSynced(filepath.Join(dir, ManifestName), b); err != nil {
		return Manifest{}, fmt.Errorf("sealing snapshot %s: %w", dir, err)
	}
	if err := syncPath(dir); err != nil {
		return Manifest{}, fmt.Errorf("sealing snapshot %s: %w", dir, err)
	}
	return m, nil
}

// Publish renames the sealed directory tmp to final and syncs their
// parent, after which the snapshot survives a crash under its name.
func Publish(tmp, final string) error {
	if _, err := os.Lstat(final); err == nil {
		return errdefs.Errorf(errdefs.ErrAlreadyExists, "snapshot %s already exists", filepath.Base(final))
	}
	if err := os.Rename(tmp, final); err != nil {
		return fmt.Errorf("publishing snapshot %s: %w", filepath.Base(final), err)
	}
	if err := syncPath(filepath.Dir(final)); err != nil {
		return fmt.Errorf("publishing snapshot %s: %w", filepath.Base(final), err)
	}
	return nil
}

// Remove deletes snapshot dir: renamed away first, so that a crash
// halfway leaves no partial snapshot under its name.
func Remove(dir string) error {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	gone := filepath.Join(filepath.Dir(dir), delPrefix+filepath.Base(dir)+"-"+hex.EncodeToString(b))
	if err := os.Rename(dir, gone); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("removing snapshot %s: %w", filepath.Base(dir), err)
	}
	if err := os.RemoveAll(gone); err != nil {
		return fmt.Errorf("removing snapshot %s: %w", filepath.Base(dir), err)
	}
	return nil
}

// Clean removes the temporary directories under parent that a crash left
// (snapshots half written or half removed) and returns the names of the
// others, the published snapshots.
func Clean(parent string) ([]string, error) {
	entries, err := os.ReadDir(parent)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing snapshots: %w", err)
	}
	var names []string
	for _, e := range entries {
		n := e.Name()
		if strings.HasPrefix(n, tmpPrefix) || strings.HasPrefix(n, delPrefix) {
			if err := os.RemoveAll(filepath.Join(parent, n)); err != nil {
				return nil, fmt.Errorf("removing interrupted snapshot %s: %w", n, err)
			}
			continue
		}
		names = append(names, n)
	}
	return names, nil
}

// ReadManifest reads the manifest of snapshot dir without checking the
// files. Errors wrap errdefs.ErrFailedPrecondition when it is damaged.
func ReadManifest(dir string) (Manifest, error) {
	b, err := os.ReadFile(filepath.Join(dir, ManifestName))
	if err != nil {
		return Manifest{}, damaged(dir, err)
	}
	var m Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return Manifest{}, damaged(dir, err)
	}
	if m.Version != 1 {
		return Manifest{}, damaged(dir, fmt.Errorf("unknown manifest version %d", m.Version))
	}
	return m, nil
}

// Verify reads the manifest and checks every file it lists against its
// size and checksum, and that no other file is present. Errors wrap
// errdefs.ErrFailedPrecondition and say which file is damaged.
func Verify(dir string) (Manifest, error) {
	m, err := ReadManifest(dir)
	if err != nil {
		return Manifest{}, err
	}
	seen := 0
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		rel = filepath.ToSlash(rel)
		if rel == ManifestName {
			return nil
		}
		want, ok := m.Files[rel]
		if !ok {
			return fmt.Errorf("unexpected file %s", rel)
		}
		got, err := hashFile(p, false)
		if err != nil {
			return err
		}
		if got != want {
			return fmt.Errorf("%s has size %d and sha256 %s, want %d and %s", rel, got.Size, got.SHA256, want.Size, want.SHA256)
		}
		seen++
		return nil
	})
	if err == nil && seen != len(m.Files) {
		err = fmt.Errorf("%d of %d files are missing", len(m.Files)-seen, len(m.Files))
	}
	if err != nil {
		return Manifest{}, damaged(dir, err)
	}
	return m, nil
}

func damaged(dir string, err error) error {
	return errdefs.Errorf(errdefs.ErrFailedPrecondition, "snapshot %s is damaged: %v", filepath.Base(dir), err)
}

func hashFile(p string, sync bool) (Sum, error) {
	f, err := os.Open(p)
	if err != nil {
		return Sum{}, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return Sum{}, fmt.Errorf("reading %s: %w", p, err)
	}
	if sync {
		if err := f.Sync(); err != nil {
			return Sum{}, fmt.Errorf("syncing %s: %w", p, err)
		}
	}
	return Sum{Size: n, SHA256: hex.EncodeToString(h.Sum(nil))}, nil
}

func writeSynced(p string, b []byte) error {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if serr := f.Sync(); err == nil {
		err = serr
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

func syncPath(p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return fmt.Errorf("syncing %s: %w", p, err)
	}
	return nil
}
