package daemon

import (
	"fmt"
	"path/filepath"
	"strings"
)

// checkAllowMounts refuses a relative --allow-mount directory, which would
// depend on the directory the daemon was started in, and cleans the rest.
func (c *Config) checkAllowMounts() error {
	for i, dir := range c.AllowMounts {
		if !filepath.IsAbs(dir) {
			return fmt.Errorf("--allow-mount %q: want an absolute path", dir)
		}
		c.AllowMounts[i] = filepath.Clean(dir)
	}
	return nil
}

// pathsFlag collects a repeatable flag's values, one path each.
type pathsFlag struct{ v *[]string }

func (f pathsFlag) String() string {
	if f.v == nil {
		return ""
	}
	return strings.Join(*f.v, ",")
}

func (f pathsFlag) Set(s string) error {
	*f.v = append(*f.v, s)
	return nil
}
