package secrets

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/corralrun/corral/internal/errdefs"
)

// newStore returns a store over recs with a new key file.
func newStore(t *testing.T, recs Records) *Store {
	t.Helper()
	s, err := Open(recs, filepath.Join(t.TempDir(), "secrets.key"))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

const value = "sk-live-0123456789abcdef"

func TestStore(t *testing.T) {
	ctx := t.Context()
	recs := NewMemStore()
	s := newStore(t, recs)
	created, err := s.Create(ctx, "a", "openai", value)
	if err != nil {
		t.Fatal(err)
	}
	if created.Name != "openai" || created.CreatedAt.IsZero() || !created.UpdatedAt.Equal(created.CreatedAt) {
		t.Fatalf("created %+v", created)
	}
	stored, _, _ := recs.Secret(ctx, "a", "openai")
	if bytes.Contains(stored.Ciphertext, []byte(value)) || len(stored.Ciphertext) != 12+len(value)+16 {
		t.Fatalf("stored ciphertext %x", stored.Ciphertext)
	}
	if v, err := s.Value(ctx, "a", "openai"); err != nil || v != value {
		t.Fatalf("value: %q %v", v, err)
	}
	// Two encryptions of one value differ: the nonce is random.
	if _, err := s.Create(ctx, "b", "openai", value); err != nil {
		t.Fatal(err)
	}
	other, _, _ := recs.Secret(ctx, "b", "openai")
	if bytes.Equal(other.Ciphertext[:12], stored.Ciphertext[:12]) || bytes.Equal(other.Ciphertext, stored.Ciphertext) {
		t.Fatal("two secrets share a nonce")
	}

	if _, err := s.Create(ctx, "a", "openai", "again"); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("second create: %v", err)
	}
	if _, err := s.Value(ctx, "c", "openai"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("another tenant's value: %v", err)
	}
	if err := s.Delete(ctx, "c", "openai"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("another tenant's delete: %v", err)
	}
	if _, err := s.Rotate(ctx, "c", "openai", "x"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("another tenant's rotate: %v", err)
	}

	rotated, err := s.Rotate(ctx, "a", "openai", "sk-new")
	if err != nil {
		t.Fatal(err)
	}
	if !rotated.CreatedAt.Equal(created.CreatedAt) || rotated.UpdatedAt.Before(created.UpdatedAt) {
		t.Errorf("rotated %+v, created %+v", rotated, created)
	}
	if v, _ := s.Value(ctx, "a", "openai"); v != "sk-new" {
		t.Errorf("value after rotation: %q", v)
	}
	list, err := s.List(ctx, "a")
	if err != nil || len(list) != 1 || list[0].Name != "openai" {
		t.Fatalf("list: %+v %v", list, err)
	}
	if err := s.Delete(ctx, "a", "openai"); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, "a", "openai"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("second delete: %v", err)
	}
	if v, err := s.Value(ctx, "b", "openai"); err != nil || v != value {
		t.Errorf("b's secret after a's delete: %q %v", v, err)
	}
}

func TestStoreRefusesBadInput(t *testing.T) {
	ctx := t.Context()
	s := newStore(t, NewMemStore())
	huge := strings.Repeat("s", MaxValueSize+1)
	for _, tt := range []struct {
		name, secretName, value string
	}{
		{"empty name", "", value},
		{"upper case", "OpenAI", value},
		{"slash", "a/b", value},
		{"too long", strings.Repeat("x", 64), value},
		{"empty value", "ok", ""},
		{"huge value", "ok", huge},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := s.Create(ctx, "a", tt.secretName, tt.value)
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("create: %v", err)
			}
			if tt.value != "" && strings.Contains(err.Error(), tt.value) {
				t.Errorf("the error shows the value: %v", err)
			}
		})
	}
	if _, err := s.Create(ctx, "a", strings.Repeat("x", 63), strings.Repeat("s", MaxValueSize)); err != nil {
		t.Errorf("longest name and value: %v", err)
	}
	if _, err := s.Create(ctx, "a", "ok", "v"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Rotate(ctx, "a", "ok", ""); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("rotate to an empty value: %v", err)
	}
}

// TestCiphertextIsBoundToItsRecord moves a ciphertext to another tenant's
// and another name's record: neither decrypts it, and the error shows
// nothing of the value.
func TestCiphertextIsBoundToItsRecord(t *testing.T) {
	ctx := t.Context()
	recs := NewMemStore()
	s := newStore(t, recs)
	for _, r := range [][2]string{{"a", "openai"}, {"b", "openai"}, {"a", "other"}} {
		if _, err := s.Create(ctx, r[0], r[1], "placeholder-"+r[0]+r[1]); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Rotate(ctx, "a", "openai", value); err != nil {
		t.Fatal(err)
	}
	src, _, _ := recs.Secret(ctx, "a", "openai")
	for _, to := range [][2]string{{"b", "openai"}, {"a", "other"}} {
		dst, _, _ := recs.Secret(ctx, to[0], to[1])
		dst.Ciphertext = src.Ciphertext
		if err := recs.PutSecret(ctx, dst); err != nil {
			t.Fatal(err)
		}
		v, err := s.Value(ctx, to[0], to[1])
		if !errors.Is(err, errdefs.ErrInternal) || v != "" {
			t.Errorf("ciphertext moved to %s/%s: %q %v", to[0], to[1], v, err)
		} else if strings.Contains(err.Error(), value) {
			t.Errorf("the error shows the value: %v", err)
		}
	}
	// A flipped bit does not decrypt either.
	src.Ciphertext[len(src.Ciphertext)-1] ^= 1
	_ = recs.PutSecret(ctx, src)
	if _, err := s.Value(ctx, "a", "openai"); !errors.Is(err, errdefs.ErrInternal) {
		t.Errorf("a changed ciphertext: %v", err)
	}
}

func TestAnotherKeyDoesNotDecrypt(t *testing.T) {
	ctx := t.Context()
	recs := NewMemStore()
	if _, err := newStore(t, recs).Create(ctx, "a", "openai", value); err != nil {
		t.Fatal(err)
	}
	if _, err := newStore(t, recs).Value(ctx, "a", "openai"); !errors.Is(err, errdefs.ErrInternal) {
		t.Errorf("value under another key: %v", err)
	}
}

func TestListShowsNoValues(t *testing.T) {
	ctx := t.Context()
	s := newStore(t, NewMemStore())
	if _, err := s.Create(ctx, "a", "openai", value); err != nil {
		t.Fatal(err)
	}
	list, err := s.List(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	// Info has no field that could hold a value; this keeps it so.
	for _, i := range list {
		if strings.Contains(i.Name, value) || len(list) != 1 {
			t.Fatalf("list %+v", list)
		}
	}
	if list, _ := s.List(ctx, "b"); len(list) != 0 {
		t.Errorf("tenant b lists %+v", list)
	}
}

func TestLoadKey(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "secrets.key")
	key, err := LoadKey(path)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 || len(key) != KeySize {
		t.Fatalf("key file mode %v, key %d bytes", fi.Mode(), len(key))
	}
	again, err := LoadKey(path)
	if err != nil || !bytes.Equal(again, key) {
		t.Fatalf("second load: %v, same key %v", err, bytes.Equal(again, key))
	}
	if left, _ := filepath.Glob(filepath.Join(dir, ".secrets-key-*")); len(left) != 0 {
		t.Errorf("temporary files left: %v", left)
	}

	for _, mode := range []os.FileMode{0o640, 0o604, 0o660, 0o644} {
		if err := os.Chmod(path, mode); err != nil {
			t.Fatal(err)
		}
		_, err := LoadKey(path)
		if err == nil || !strings.Contains(err.Error(), "chmod 600") {
			t.Errorf("mode %04o: %v", mode, err)
		}
	}
	if err := os.Chmod(path, 0o400); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadKey(path); err != nil {
		t.Errorf("mode 0400: %v", err)
	}

	short := filepath.Join(dir, "short.key")
	if err := os.WriteFile(short, []byte("0123"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadKey(short); err == nil || !strings.Contains(err.Error(), "want exactly 32 bytes, found 4") {
		t.Errorf("short key: %v", err)
	}
	if _, err := LoadKey(filepath.Join(dir, "missing-dir", "secrets.key")); err == nil {
		t.Error("a key in a missing directory was created")
	}
}

func TestLoadKeyRefusesAnotherOwner(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("changing a file's owner needs root")
	}
	path := filepath.Join(t.TempDir(), "secrets.key")
	if _, err := LoadKey(path); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(path, 65534, -1); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadKey(path); err == nil || !strings.Contains(err.Error(), "chown") {
		t.Errorf("a key of another user: %v", err)
	}
}

func TestSource(t *testing.T) {
	ctx := t.Context()
	s := newStore(t, NewMemStore())
	for _, tenant := range []string{"a", "b"} {
		if _, err := s.Create(ctx, tenant, "openai", "value-of-"+tenant); err != nil {
			t.Fatal(err)
		}
	}
	owners := map[string]string{"sb-a": "a", "sb-b": "b", "sb-c": "c"}
	src := Source{Store: s, Owner: func(_ context.Context, id string) (string, error) {
		t, ok := owners[id]
		if !ok {
			return "", errdefs.Errorf(errdefs.ErrNotFound, "sandbox %s not found", id)
		}
		return t, nil
	}}
	for id, want := range map[string]string{"sb-a": "value-of-a", "sb-b": "value-of-b"} {
		if v, err := src.Secret(ctx, id, "openai"); err != nil || v != want {
			t.Errorf("%s: %q %v", id, v, err)
		}
	}
	if _, err := src.Secret(ctx, "sb-c", "openai"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("a tenant without the secret: %v", err)
	}
	if _, err := src.Secret(ctx, "gone", "openai"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("a missing sandbox: %v", err)
	}
	if _, err := s.Rotate(ctx, "a", "openai", "rotated"); err != nil {
		t.Fatal(err)
	}
	if v, _ := src.Secret(ctx, "sb-a", "openai"); v != "rotated" {
		t.Errorf("after rotation: %q", v)
	}
}
