package secrets

import (
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// KeySize is the size of the key that encrypts every secret: AES-256.
const KeySize = 32

// LoadKey returns the key in the file at path, creating the file with a
// new random key, mode 0600, when there is none. It refuses a key file
// that anyone but its owner may read or write, or that another user
// owns: whoever reads it can decrypt every tenant's secrets. Losing the
// file loses every secret, so it is backed up with the database.
func LoadKey(path string) ([]byte, error) {
	key, err := readKey(path)
	if errors.Is(err, fs.ErrNotExist) {
		if err := createKey(path); err != nil {
			return nil, err
		}
		key, err = readKey(path)
	}
	return key, err
}

func readKey(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("reading secrets key %s: %w", path, err)
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return nil, fmt.Errorf("secrets key %s has mode %04o, which lets others read or change it; fix it with: chmod 600 %s", path, perm, path)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != os.Geteuid() {
		return nil, fmt.Errorf("secrets key %s belongs to uid %d, not to the daemon's user (uid %d); fix it with: chown %d %s", path, st.Uid, os.Geteuid(), os.Geteuid(), path)
	}
	key, err := io.ReadAll(io.LimitReader(f, KeySize+1))
	if err != nil {
		return nil, fmt.Errorf("reading secrets key %s: %w", path, err)
	}
	if len(key) != KeySize {
		return nil, fmt.Errorf("secrets key %s: want exactly %d bytes, found %s", path, KeySize, sizeOf(len(key)))
	}
	return key, nil
}

// createKey writes a new key to a temporary file and links it into place,
// so that path never names a partly written key and a concurrent creator
// cannot replace one that exists.
func createKey(path string) error {
	key := make([]byte, KeySize)
	if _, err := rand.Read(key); err != nil {
		return fmt.Errorf("making a secrets key: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".secrets-key-*")
	if err != nil {
		return fmt.Errorf("creating secrets key %s: %w", path, err)
	}
	defer os.Remove(tmp.Name())
	err = tmp.Chmod(0o600)
	if err == nil {
		_, err = tmp.Write(key)
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		if err = os.Link(tmp.Name(), path); errors.Is(err, fs.ErrExist) {
			err = nil
		}
	}
	if err != nil {
		return fmt.Errorf("creating secrets key %s: %w", path, err)
	}
	return nil
}

func sizeOf(n int) string {
	if n > KeySize {
		return "more"
	}
	return fmt.Sprintf("%d", n)
}
