package memstore_test

import (
	"encoding/json"
	"testing"

	"github.com/corralrun/corral/internal/records/memstore"
	"github.com/corralrun/corral/internal/records/recordstest"
	"github.com/corralrun/corral/internal/sandbox"
)

// store keeps every kind of record, as package records does.
type store struct {
	*memstore.Store[sandbox.Sandbox, sandbox.Template, sandbox.Pool]
	*memstore.SnapshotStore[sandbox.Snapshot]
	*memstore.VolumeStore[sandbox.Volume]
}

// kind keys records with key and copies them through JSON, the form
// package records keeps them in (the sandbox package's own copy functions
// are not exported).
func kind[V any](key func(V) string) memstore.Kind[V] {
	return memstore.Kind[V]{Key: key, Clone: func(v V) V {
		data, err := json.Marshal(v)
		if err != nil {
			panic(err)
		}
		var out V
		if err := json.Unmarshal(data, &out); err != nil {
			panic(err)
		}
		return out
	}}
}

func TestConformance(t *testing.T) {
	recordstest.Run(t, recordstest.Config{
		New: func(t *testing.T) recordstest.Store {
			return store{
				Store: memstore.New(
					kind(func(sb sandbox.Sandbox) string { return sb.ID }),
					kind(func(t sandbox.Template) string { return t.Name }),
					kind(func(p sandbox.Pool) string { return p.Name })),
				SnapshotStore: memstore.NewSnapshotStore(kind(func(s sandbox.Snapshot) string { return s.Name })),
				VolumeStore:   memstore.NewVolumeStore(kind(func(v sandbox.Volume) string { return v.Name })),
			}
		},
	})
}
