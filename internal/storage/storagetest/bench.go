package storagetest

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/storage"
)

// BenchCreateRootIDMap measures what RootOptions.IDMap adds to CreateRoot:
// each round makes (and then deletes) one root without and one with an
// ID mapping, alternating which goes first, and it reports both p50s and
// their difference. The namespace is made once, as a driver makes it
// ahead of a create.
func BenchCreateRootIDMap(b *testing.B, be storage.Backend) {
	if err := be.CreateTemplate(b.Context(), "base", fillSample); err != nil {
		b.Fatal(err)
	}
	ns := MappingNS(b, driver.StoredIDBase, driver.StoredIDBase+5*driver.StoredIDSize, driver.StoredIDSize)
	defer ns.Close()
	var plain, mapped []time.Duration
	one := func(i int, opts storage.RootOptions) time.Duration {
		id := fmt.Sprintf("bench-%d-%t", i, opts.IDMap != nil)
		start := time.Now()
		if _, err := be.CreateRoot(b.Context(), id, "base", opts); err != nil {
			b.Fatal(err)
		}
		d := time.Since(start)
		if err := be.DeleteRoot(b.Context(), id); err != nil {
			b.Fatal(err)
		}
		return d
	}
	for i := 0; b.Loop(); i++ {
		if i%2 == 0 {
			plain = append(plain, one(i, storage.RootOptions{}))
			mapped = append(mapped, one(i, storage.RootOptions{IDMap: ns}))
		} else {
			mapped = append(mapped, one(i, storage.RootOptions{IDMap: ns}))
			plain = append(plain, one(i, storage.RootOptions{}))
		}
	}
	p, m := p50(plain), p50(mapped)
	b.ReportMetric(float64(p.Microseconds()), "plain-p50-us")
	b.ReportMetric(float64(m.Microseconds()), "idmap-p50-us")
	b.ReportMetric(float64((m - p).Microseconds()), "added-us")
}

func p50(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}
