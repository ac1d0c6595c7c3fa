package secrets

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"fmt"
	"sync"
	"time"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/tenancy"
)

// MaxValueSize is the largest value a secret holds: room for a key, a
// token or a certificate, not for files.
const MaxValueSize = 64 << 10

// Record is a secret as it is stored: its value only as Ciphertext, a
// random nonce followed by the AES-256-GCM sealed value, sealed with the
// tenant and name as additional data so that a ciphertext copied to
// another record does not open.
type Record struct {
	Tenant     string    `json:"tenant"`
	Name       string    `json:"name"`
	Ciphertext []byte    `json:"ciphertext"`
	CreatedAt  time.Time `json:"created_at"`
	UpdatedAt  time.Time `json:"updated_at"`
}

// Records persists secret records. Tenant "" is the operator's own.
type Records interface {
	// PutSecret inserts or replaces the record of r.Tenant and r.Name.
	PutSecret(ctx context.Context, r Record) error
	// DeleteSecret removes a record; a missing one is not an error.
	DeleteSecret(ctx context.Context, tenant, name string) error
	// Secret returns a record and whether there is one.
	Secret(ctx context.Context, tenant, name string) (Record, bool, error)
	// Secrets returns the records of tenant, by name.
	Secrets(ctx context.Context, tenant string) ([]Record, error)
}

// Info describes a secret without its value.
type Info struct {
	Name      string
	CreatedAt time.Time
	UpdatedAt time.Time
}

// Store keeps the tenants' secrets in Records, encrypted. Writes are
// serialized, so Create's check for a taken name holds; reads take no
// lock. A value is read from Records on every call, so a rotation takes
// effect on the next request that needs the secret. Safe for concurrent
// use.
type Store struct {
	recs Records
	aead cipher.AEAD
	mu   sync.Mutex
}

// New returns a store of recs encrypting under key, KeySize bytes
// (LoadKey).
func New(recs Records, key []byte) (*Store, error) {
	if len(key) != KeySize {
		return nil, fmt.Errorf("secrets key: want %d bytes, got %d", KeySize, len(key))
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, fmt.Errorf("secrets key: %w", err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, fmt.Errorf("secrets key: %w", err)
	}
	return &Store{recs: recs, aead: aead}, nil
}

// Open returns a store of recs under the key file at keyPath (LoadKey).
func Open(recs Records, keyPath string) (*Store, error) {
	key, err := LoadKey(keyPath)
	if err != nil {
		return nil, err
	}
	return New(recs, key)
}

// CheckName fails unless name is a valid secret name: it appears in
// URLs, policies ({{secret:NAME}}) and the audit log.
func CheckName(name string) error { return tenancy.CheckName("secret name", name) }

// checkValue says what is wrong with a value without showing it.
func checkValue(value string) error {
	switch {
	case value == "":
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "a secret's value must not be empty")
	case len(value) > MaxValueSize:
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "a secret's value is %d bytes, more than the %d allowed", len(value), MaxValueSize)
	}
	return nil
}

// Create stores a new secret name of tenant. A name the tenant already
// uses is ErrAlreadyExists.
func (s *Store) Create(ctx context.Context, tenant, name, value string) (Info, error) {
	if err := CheckName(name); err != nil {
		return Info{}, err
	}
	if err := checkValue(value); err != nil {
		return Info{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok, err := s.recs.Secret(ctx, tenant, name); err != nil {
		return Info{}, err
	} else if ok {
		return Info{}, errdefs.Errorf(errdefs.ErrAlreadyExists, "secret %s already exists", name)
	}
	now := time.Now().UTC()
	return s.put(ctx, Record{Tenant: tenant, Name: name, CreatedAt: now, UpdatedAt: now}, value)
}

// Rotate replaces the value of tenant's secret name; requests that need
// it use the new value from then on. A missing secret is ErrNotFound.
func (s *Store) Rotate(ctx context.Context, tenant, name, value string) (Info, error) {
	if err := checkValue(value); err != nil {
		return Info{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r, err := s.get(ctx, tenant, name)
	if err != nil {
		return Info{}, err
	}
	r.UpdatedAt = time.Now().UTC()
	return s.put(ctx, r, value)
}

// Delete removes tenant's secret name. A missing secret is ErrNotFound.
func (s *Store) Delete(ctx context.Context, tenant, name string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := s.get(ctx, tenant, name); err != nil {
		return err
	}
	return s.recs.DeleteSecret(ctx, tenant, name)
}

// List describes tenant's secrets, by name, without their values.
func (s *Store) List(ctx context.Context, tenant string) ([]Info, error) {
	recs, err := s.recs.Secrets(ctx, tenant)
	if err != nil {
		return nil, err
	}
	out := make([]Info, 0, len(recs))
	for _, r := range recs {
		out = append(out, info(r))
	}
	return out, nil
}

// Value returns the value of tenant's secret name, for the daemon's own
// use only: no API returns it. A missing secret is ErrNotFound; a record
// that does not decrypt under this store's key is ErrInternal.
func (s *Store) Value(ctx context.Context, tenant, name string) (string, error) {
	r, err := s.get(ctx, tenant, name)
	if err != nil {
		return "", err
	}
	ns := s.aead.NonceSize()
	if len(r.Ciphertext) < ns {
		return "", errdefs.Errorf(errdefs.ErrInternal, "secret %s does not decrypt: its record is damaged", name)
	}
	plain, err := s.aead.Open(nil, r.Ciphertext[:ns], r.Ciphertext[ns:], additionalData(tenant, name))
	if err != nil {
		// The cipher's error says nothing more, and nothing of the value.
		return "", errdefs.Errorf(errdefs.ErrInternal, "secret %s does not decrypt: the secrets key is not the one it was stored with, or its record was changed", name)
	}
	return string(plain), nil
}

func (s *Store) get(ctx context.Context, tenant, name string) (Record, error) {
	r, ok, err := s.recs.Secret(ctx, tenant, name)
	if err != nil {
		return Record{}, err
	}
	if !ok {
		return Record{}, errdefs.Errorf(errdefs.ErrNotFound, "secret %s not found", name)
	}
	return r, nil
}

// put seals value into r and stores it.
func (s *Store) put(ctx context.Context, r Record, value string) (Info, error) {
	nonce := make([]byte, s.aead.NonceSize(), s.aead.NonceSize()+len(value)+s.aead.Overhead())
	if _, err := rand.Read(nonce); err != nil {
		return Info{}, fmt.Errorf("making a nonce for secret %s: %w", r.Name, err)
	}
	r.Ciphertext = s.aead.Seal(nonce, nonce, []byte(value), additionalData(r.Tenant, r.Name))
	if err := s.recs.PutSecret(ctx, r); err != nil {
		return Info{}, err
	}
	return info(r), nil
}

// additionalData binds a ciphertext to its record. Names cannot hold a
// NUL, so the encoding is unambiguous.
func additionalData(tenant, name string) []byte {
	return []byte("corral-secret-v1\x00" + tenant + "\x00" + name)
}

func info(r Record) Info { return Info{Name: r.Name, CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt} }
