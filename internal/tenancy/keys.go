package tenancy

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"regexp"
	"slices"
	"sync"
	"time"

	"github.com/corralrun/corral/internal/errdefs"
)

// Key is an API key's record. The secret itself is never stored: Hash is
// its SHA-256, enough for a random 256-bit secret, which no dictionary
// holds.
type Key struct {
	Name      string    `json:"name"`
	Tenant    string    `json:"tenant"`
	Admin     bool      `json:"admin,omitempty"`
	Quota     Quota     `json:"quota,omitzero"`
	Hash      string    `json:"hash"`
	CreatedAt time.Time `json:"created_at"`
	RotatedAt time.Time `json:"rotated_at,omitzero"`
}

// Principal is the principal a request with k acts as.
func (k Key) Principal() Principal {
	return Principal{Tenant: k.Tenant, Key: k.Name, Admin: k.Admin, Quota: k.Quota}
}

// Store persists key records.
type Store interface {
	PutKey(ctx context.Context, k Key) error
	DeleteKey(ctx context.Context, name string) error
	Keys(ctx context.Context) ([]Key, error)
}

// BootstrapName is the name of the --api-key key, an admin key that is
// configuration rather than a record.
const BootstrapName = "admin"

// validName is what key and tenant names look like: they appear in
// URLs, logs, metrics labels and metadata.
var validName = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)

// CheckName fails unless s is a valid key or tenant name.
func CheckName(what, s string) error {
	if !validName.MatchString(s) {
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "%s %q: want 1-63 lowercase letters, digits, '.', '_' or '-', starting with a letter or digit", what, s)
	}
	return nil
}

// Keys is the set of API keys: the records of a Store, cached, and the
// bootstrap key. Lookups take no lock a write holds for long; it is safe
// for concurrent use.
type Keys struct {
	store     Store
	bootstrap string // SHA-256 of the --api-key key, "" without one

	mu     sync.RWMutex
	byHash map[string]Key
	byName map[string]Key
	// revoked is closed and replaced whenever a key stops working, so
	// that long requests of that key can end (Revoked).
	revoked chan struct{}
}

// NewKeys loads the keys of store. bootstrapKey, when not empty, is an
// admin key named BootstrapName that is not a record.
func NewKeys(ctx context.Context, store Store, bootstrapKey string) (*Keys, error) {
	ks := &Keys{store: store, byHash: map[string]Key{}, byName: map[string]Key{}, revoked: make(chan struct{})}
	if bootstrapKey != "" {
		ks.bootstrap = Digest(bootstrapKey)
	}
	all, err := store.Keys(ctx)
	if err != nil {
		return nil, fmt.Errorf("loading API keys: %w", err)
	}
	for _, k := range all {
		ks.byHash[k.Hash], ks.byName[k.Name] = k, k
	}
	return ks, nil
}

// Digest is the stored form of a key's secret.
func Digest(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:])
}

// Authenticate returns the principal of secret. Every failure is the same
// ErrUnauthenticated: which part was wrong is not told.
func (ks *Keys) Authenticate(secret string) (Principal, error) {
	if secret != "" {
		d := Digest(secret)
		if ks.bootstrap != "" && subtle.ConstantTimeCompare([]byte(d), []byte(ks.bootstrap)) == 1 {
			return Principal{Key: BootstrapName, Admin: true}, nil
		}
		// A map lookup by digest: the digest of a guess says nothing
		// about the stored ones, so timing leaks nothing useful.
		ks.mu.RLock()
		k, ok := ks.byHash[d]
		ks.mu.RUnlock()
		if ok {
			return k.Principal(), nil
		}
	}
	return Principal{}, errdefs.Errorf(errdefs.ErrUnauthenticated, "missing or invalid API key (send it as 'Authorization: Bearer KEY' or 'X-API-Key: KEY')")
}

// Revoked returns a channel closed when any key stops working (deleted or
// rotated); long requests wait on it and check their own key again.
func (ks *Keys) Revoked() <-chan struct{} {
	ks.mu.RLock()
	defer ks.mu.RUnlock()
	return ks.revoked
}

// Watch returns ctx, cancelled (its cause ErrUnauthenticated) once
// secret stops working, and a function that ends the watch and waits for
// it. A request of a key runs under the returned context, so that its
// long calls (streams, attach sessions, port proxies) end when the key is
// deleted or rotated. The --api-key key cannot be revoked and is not
// watched.
func (ks *Keys) Watch(ctx context.Context, secret string) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	if p, err := ks.Authenticate(secret); err == nil && p.Key == BootstrapName {
		return ctx, func() { cancel(nil) }
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			// The channel first, then the check: a revocation between
			// them closes this channel.
			revoked := ks.Revoked()
			if _, err := ks.Authenticate(secret); err != nil {
				cancel(errdefs.Errorf(errdefs.ErrUnauthenticated, "the API key was revoked"))
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-revoked:
			}
		}
	}()
	return ctx, func() {
		cancel(nil)
		<-done
	}
}

// KeyOptions describe a new key.
type KeyOptions struct {
	Name   string
	Tenant string // default: Name
	Admin  bool
	Quota  Quota
}

// Create makes a key and returns its record and its secret, which is not
// kept anywhere: the caller shows it once.
func (ks *Keys) Create(ctx context.Context, o KeyOptions) (Key, string, error) {
	if err := CheckName("key name", o.Name); err != nil {
		return Key{}, "", err
	}
	if o.Name == BootstrapName {
		return Key{}, "", errdefs.Errorf(errdefs.ErrInvalidArgument, "key name %q is the --api-key key's", o.Name)
	}
	if o.Tenant == "" {
		o.Tenant = o.Name
	}
	if err := CheckName("tenant", o.Tenant); err != nil {
		return Key{}, "", err
	}
	if err := o.Quota.check(); err != nil {
		return Key{}, "", err
	}
	secret, err := newSecret()
	if err != nil {
		return Key{}, "", err
	}
	k := Key{Name: o.Name, Tenant: o.Tenant, Admin: o.Admin, Quota: o.Quota, Hash: Digest(secret), CreatedAt: time.Now().UTC()}
	ks.mu.Lock()
	defer ks.mu.Unlock()
	if _, ok := ks.byName[k.Name]; ok {
		return Key{}, "", errdefs.Errorf(errdefs.ErrAlreadyExists, "key %s already exists", k.Name)
	}
	if err := ks.store.PutKey(ctx, k); err != nil {
		return Key{}, "", err
	}
	ks.byHash[k.Hash], ks.byName[k.Name] = k, k
	return k, secret, nil
}

// Rotate gives key name a new secret; the old one stops working at once.
func (ks *Keys) Rotate(ctx context.Context, name string) (Key, string, error) {
	secret, err := newSecret()
	if err != nil {
		return Key{}, "", err
	}
	ks.mu.Lock()
	defer ks.mu.Unlock()
	k, ok := ks.byName[name]
	if !ok {
		return Key{}, "", errdefs.Errorf(errdefs.ErrNotFound, "key %s not found", name)
	}
	old := k.Hash
	k.Hash, k.RotatedAt = Digest(secret), time.Now().UTC()
	if err := ks.store.PutKey(ctx, k); err != nil {
		return Key{}, "", err
	}
	delete(ks.byHash, old)
	ks.byHash[k.Hash], ks.byName[k.Name] = k, k
	ks.revokeLocked()
	return k, secret, nil
}

// Delete revokes key name.
func (ks *Keys) Delete(ctx context.Context, name string) error {
	ks.mu.Lock()
	defer ks.mu.Unlock()
	k, ok := ks.byName[name]
	if !ok {
		return errdefs.Errorf(errdefs.ErrNotFound, "key %s not found", name)
	}
	if err := ks.store.DeleteKey(ctx, name); err != nil {
		return err
	}
	delete(ks.byHash, k.Hash)
	delete(ks.byName, name)
	ks.revokeLocked()
	return nil
}

func (ks *Keys) revokeLocked() {
	close(ks.revoked)
	ks.revoked = make(chan struct{})
}

// List returns the key records, by name, hashes left out.
func (ks *Keys) List() []Key {
	ks.mu.RLock()
	defer ks.mu.RUnlock()
	out := make([]Key, 0, len(ks.byName))
	for _, k := range ks.byName {
		k.Hash = ""
		out = append(out, k)
	}
	slices.SortFunc(out, func(a, b Key) int {
		if a.Name < b.Name {
			return -1
		}
		if a.Name > b.Name {
			return 1
		}
		return 0
	})
	return out
}

// newSecret returns a random key: "crl_" and 43 characters of base64url
// for 256 bits.
func newSecret() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("making a key: %w", err)
	}
	return "crl_" + base64.RawURLEncoding.EncodeToString(b), nil
}

func (q Quota) check() error {
	if q.Sandboxes < 0 || q.MemoryBytes < 0 || q.MilliCPUs < 0 || q.DiskBytes < 0 || q.CreatesPerMinute < 0 {
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "quotas must not be negative")
	}
	return nil
}

// MemStore is a Store in memory, for a daemon without key records and for
// tests.
type MemStore struct {
	mu   sync.Mutex
	keys map[string]Key
}

// NewMemStore returns an empty MemStore.
func NewMemStore() *MemStore { return &MemStore{keys: map[string]Key{}} }

// PutKey implements Store.
func (m *MemStore) PutKey(_ context.Context, k Key) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.keys[k.Name] = k
	return nil
}

// DeleteKey implements Store.
func (m *MemStore) DeleteKey(_ context.Context, name string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.keys, name)
	return nil
}

// Keys implements Store.
func (m *MemStore) Keys(context.Context) ([]Key, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]Key, 0, len(m.keys))
	for _, k := range m.keys {
		out = append(out, k)
	}
	return out, nil
}
