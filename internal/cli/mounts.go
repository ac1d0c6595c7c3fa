package cli

import (
	"context"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"

	corral "github.com/corralrun/corral/sdk"
)

// volumeFlag collects repeatable -v SRC:DST[:MODE] values, docker run's
// syntax for bind mounts, as the mounts of a create.
type volumeFlag struct{ mounts []corral.Mount }

func (f *volumeFlag) String() string {
	if f == nil {
		return ""
	}
	var s []string
	for _, m := range f.mounts {
		src := m.Source
		if m.Volume != "" {
			src = m.Volume
		}
		s = append(s, src+":"+m.Target+":"+m.Mode)
	}
	return strings.Join(s, ",")
}

func (f *volumeFlag) Set(v string) error {
	m, err := parseVolume(v, os.Getwd)
	if err != nil {
		return err
	}
	f.mounts = append(f.mounts, m)
	return nil
}

// parseVolume parses SRC:DST[:MODE]. As with docker, a SRC that is
// neither absolute nor starts with ./ or ../ (or is . or ..) names a
// volume; a relative one is made absolute against getwd here, since the
// daemon does not share the CLI's working directory. MODE is ro, rw or
// cow, rw when left out.
func parseVolume(v string, getwd func() (string, error)) (corral.Mount, error) {
	parts := strings.Split(v, ":")
	if len(parts) < 2 || len(parts) > 3 {
		return corral.Mount{}, fmt.Errorf("want SRC:DST or SRC:DST:MODE")
	}
	m := corral.Mount{Source: parts[0], Target: parts[1], Mode: corral.MountReadWrite}
	if len(parts) == 3 {
		m.Mode = parts[2]
	}
	switch m.Mode {
	case corral.MountReadOnly, corral.MountReadWrite, corral.MountCopyOnWrite:
	default:
		return corral.Mount{}, fmt.Errorf("mode %q: want ro, rw or cow", m.Mode)
	}
	if !strings.HasPrefix(m.Target, "/") {
		return corral.Mount{}, fmt.Errorf("target %q: want an absolute path in the sandbox", m.Target)
	}
	switch {
	case strings.HasPrefix(m.Source, "/"):
	case m.Source == "." || m.Source == ".." || strings.HasPrefix(m.Source, "./") || strings.HasPrefix(m.Source, "../"):
		wd, err := getwd()
		if err != nil {
			return corral.Mount{}, fmt.Errorf("source %q: finding the working directory: %w", m.Source, err)
		}
		m.Source = filepath.Join(wd, m.Source)
	case m.Source == "":
		return corral.Mount{}, fmt.Errorf("source is empty: want a host directory")
	default:
		m.Volume, m.Source, m.Target = m.Source, "", path.Clean(m.Target)
		return m, nil
	}
	// A trailing slash names the same directory, as it does for docker.
	m.Source, m.Target = filepath.Clean(m.Source), path.Clean(m.Target)
	return m, nil
}

// changeMark is the letter diff prints for each kind of change.
var changeMark = map[string]string{corral.ChangeAdded: "A", corral.ChangeModified: "M", corral.ChangeDeleted: "D"}

// diff prints what a sandbox changed under its cow mount at DST, one
// "A|M|D PATH" line each (--json: the list).
func (c *cli) diff(args []string) int {
	fs := c.flags("diff")
	asJSON := fs.Bool("json", false, "print the changes as JSON")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if fs.NArg() != 2 {
		fmt.Fprintln(c.env.Stderr, "usage: corral diff [--json] ID DST")
		return exitUsage
	}
	client, err := c.client()
	if err != nil {
		return c.fail(err)
	}
	defer client.Close()
	changes, err := client.MountChanges(context.Background(), fs.Arg(0), fs.Arg(1))
	if err != nil {
		return c.fail(err)
	}
	if *asJSON {
		return c.printJSON(changes)
	}
	for _, ch := range changes {
		fmt.Fprintf(c.env.Stdout, "%s %s\n", changeMark[ch.Kind], ch.Path)
	}
	return 0
}
