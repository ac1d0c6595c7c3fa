package daemon

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/corralrun/corral/internal/templates"
)

// openImages opens the image service: the image cache under
// <state>/images, the build cache on the storage's own filesystem when the
// backend offers a scratch directory there (btrfs: copies of build results
// into templates are then clones), else under <state>/build.
func (d *Daemon) openImages(context.Context) error {
	buildDir := filepath.Join(d.cfg.StateDir, "build")
	if sd, ok := d.storage.(interface{ ScratchDir(string) (string, error) }); ok {
		dir, err := sd.ScratchDir("build")
		if err != nil {
			return err
		}
		buildDir = dir
	}
	svc, err := templates.Open(templates.Config{
		Manager:  d.manager,
		CacheDir: filepath.Join(d.cfg.StateDir, "images"),
		BuildDir: buildDir,
		Logger:   d.log,
	})
	if err != nil {
		return fmt.Errorf("opening image service: %w", err)
	}
	d.images = svc
	return nil
}
