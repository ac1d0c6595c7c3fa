package ociimage

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strconv"
	"strings"

	"github.com/corralrun/corral/internal/errdefs"
)

// copyStep plans a COPY or ADD: it parses flags and arguments, resolves
// sources in the build context and hashes their contents.
func (p *planner) copyStep(st *Step) (*copySpec, string, error) {
	spec := &copySpec{}
	if err := p.copyFlags(st, spec); err != nil {
		return nil, "", err
	}
	srcs, err := p.copyArgs(st, spec)
	if err != nil {
		return nil, "", err
	}
	if err := p.openContext(st.Cmd); err != nil {
		return nil, "", err
	}
	for _, s := range srcs {
		matches, err := p.matchSources(s)
		if err != nil {
			return nil, "", err
		}
		spec.sources = append(spec.sources, matches...)
	}
	if len(spec.sources) > 1 && !strings.HasSuffix(spec.dest, "/") {
		return nil, "", fmt.Errorf("with several sources the destination must be a directory ending in /: %w", errdefs.ErrInvalidArgument)
	}
	if st.Cmd == "ADD" {
		for _, s := range spec.sources {
			if err := p.refuseArchive(s); err != nil {
				return nil, "", err
			}
		}
	}
	sum, err := hashSources(p.ctxRoot, spec.sources)
	if err != nil {
		return nil, "", err
	}
	return spec, sum, nil
}

// copyFlags sets spec's owner and mode from --chown and --chmod and
// refuses every other flag.
func (p *planner) copyFlags(st *Step, spec *copySpec) error {
	for _, f := range st.Flags {
		name, value, _ := strings.Cut(f, "=")
		var err error
		switch name {
		case "--chown":
			spec.chown, err = p.lexer().word(value)
		case "--chmod":
			var m uint64
			m, err = strconv.ParseUint(value, 8, 32)
			if err == nil && m > 0o7777 {
				err = errors.New("mode out of range")
			}
			spec.chmod = fileMode(m)
		case "--from":
			return fmt.Errorf("%s: multi-stage builds are not supported: %w", f, errdefs.ErrNotImplemented)
		default:
			return fmt.Errorf("flag %s is not supported: %w", f, errdefs.ErrNotImplemented)
		}
		if err != nil {
			return fmt.Errorf("flag %s: %w: %w", f, err, errdefs.ErrInvalidArgument)
		}
	}
	return nil
}

// copyArgs splits the arguments into the sources, as written, and the
// destination, which it sets in spec made absolute against WORKDIR.
func (p *planner) copyArgs(st *Step, spec *copySpec) ([]string, error) {
	words := st.JSON
	if words == nil {
		var err error
		if words, err = p.lexer().words(st.Args); err != nil {
			return nil, fmt.Errorf("%w: %w", err, errdefs.ErrInvalidArgument)
		}
	}
	if len(words) < 2 {
		return nil, fmt.Errorf("want %s <source>... <destination>: %w", st.Cmd, errdefs.ErrInvalidArgument)
	}
	srcs, dest := words[:len(words)-1], words[len(words)-1]
	if !path.IsAbs(dest) {
		// Relative destinations are relative to WORKDIR; keep a trailing
		// slash, which says "into this directory".
		slash := strings.HasSuffix(dest, "/") || dest == "." || dest == ".."
		dest = path.Join(p.workdirOrRoot(), dest)
		if slash && dest != "/" {
			dest += "/"
		}
	}
	spec.dest = dest
	if st.Cmd == "ADD" {
		for _, s := range srcs {
			if strings.Contains(s, "://") || strings.HasPrefix(s, "git@") {
				return nil, fmt.Errorf("ADD of URL %s is not supported: download it in a RUN step: %w", s, errdefs.ErrNotImplemented)
			}
		}
	}
	return srcs, nil
}

// openContext opens the build context once for the whole plan: every
// source is resolved inside it, so that nothing outside can be copied.
func (p *planner) openContext(cmd string) error {
	if p.opts.Context == "" {
		return fmt.Errorf("%s needs a build context: %w", cmd, errdefs.ErrInvalidArgument)
	}
	if p.ctxRoot == nil {
		r, err := os.OpenRoot(p.opts.Context)
		if err != nil {
			return fmt.Errorf("opening build context: %w", err)
		}
		p.ctxRoot = r
	}
	return nil
}

func fileMode(m uint64) fs.FileMode {
	mode := fs.FileMode(m & 0o777)
	if m&0o4000 != 0 {
		mode |= fs.ModeSetuid
	}
	if m&0o2000 != 0 {
		mode |= fs.ModeSetgid
	}
	if m&0o1000 != 0 {
		mode |= fs.ModeSticky
	}
	return mode
}

// matchSources resolves one source of COPY or ADD to clean paths in the
// context, expanding globs.
func (p *planner) matchSources(s string) ([]string, error) {
	clean := path.Clean(strings.TrimLeft(s, "/"))
	if clean == "" {
		clean = "."
	}
	if clean == ".." || strings.HasPrefix(clean, "../") {
		return nil, fmt.Errorf("source %q is outside the build context: %w", s, errdefs.ErrInvalidArgument)
	}
	if !strings.ContainsAny(clean, "*?[") {
		if _, err := p.ctxRoot.Stat(clean); err != nil {
			return nil, fmt.Errorf("source %q in the build context: %w: %w", s, err, errdefs.ErrInvalidArgument)
		}
		return []string{clean}, nil
	}
	matches, err := fs.Glob(p.ctxRoot.FS(), clean)
	if err != nil {
		return nil, fmt.Errorf("source pattern %q: %w: %w", s, err, errdefs.ErrInvalidArgument)
	}
	if len(matches) == 0 {
		return nil, fmt.Errorf("no file in the build context matches %q: %w", s, errdefs.ErrInvalidArgument)
	}
	return matches, nil
}

// refuseArchive refuses an ADD source that Docker would extract: a local
// tar archive, compressed or not.
func (p *planner) refuseArchive(s string) error {
	fi, err := p.ctxRoot.Stat(s)
	if err != nil || !fi.Mode().IsRegular() {
		return nil
	}
	f, err := p.ctxRoot.Open(s)
	if err != nil {
		return fmt.Errorf("source %q: %w", s, err)
	}
	defer f.Close()
	head := make([]byte, 512)
	n, _ := io.ReadFull(f, head)
	head = head[:n]
	archive := bytes.HasPrefix(head, []byte{0x1f, 0x8b}) || bytes.HasPrefix(head, []byte("BZh")) ||
		bytes.HasPrefix(head, []byte{0xfd, '7', 'z', 'X', 'Z', 0}) || bytes.HasPrefix(head, []byte{0x28, 0xb5, 0x2f, 0xfd}) ||
		n >= 262 && bytes.Equal(head[257:262], []byte("ustar"))
	if archive {
		return fmt.Errorf("ADD of archive %s would extract it, which is not supported: use COPY and a RUN step that extracts it: %w", s, errdefs.ErrNotImplemented)
	}
	return nil
}

// hashSources hashes the names, types, permission bits and contents of
// the sources and everything under them; owners and times do not count,
// since COPY does not keep owners and Docker's cache ignores times.
func hashSources(root *os.Root, sources []string) (string, error) {
	h := sha256.New()
	buf := make([]byte, 128<<10)
	for _, src := range sources {
		err := fs.WalkDir(root.FS(), src, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			fi, err := d.Info()
			if err != nil {
				return err
			}
			fmt.Fprintf(h, "%s\x00%o\x00", p, fi.Mode()&(fs.ModeType|fs.ModePerm|fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky))
			switch {
			case fi.Mode()&fs.ModeSymlink != 0:
				target, err := root.Readlink(p)
				if err != nil {
					return err
				}
				fmt.Fprintf(h, "%s\x00", target)
			case fi.Mode().IsRegular():
				f, err := root.Open(p)
				if err != nil {
					return err
				}
				fh := sha256.New()
				_, err = io.CopyBuffer(fh, f, buf)
				f.Close()
				if err != nil {
					return err
				}
				fmt.Fprintf(h, "%s\x00", hex.EncodeToString(fh.Sum(nil)))
			}
			return nil
		})
		if err != nil {
			return "", fmt.Errorf("hashing %s in the build context: %w", src, err)
		}
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// copyIn runs a planned COPY or ADD into the tree at dir.
//
// Docker's rules: a directory source has its contents copied into the
// destination; a file source is copied to the destination path, or into
// it when the destination ends in "/" or is an existing directory. Files
// belong to root unless --chown says otherwise; --chmod replaces modes.
func copyIn(ctx context.Context, dir string, spec *copySpec, contextDir string) error {
	sroot, err := os.OpenRoot(contextDir)
	if err != nil {
		return fmt.Errorf("opening build context: %w", err)
	}
	defer sroot.Close()
	droot, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer droot.Close()
	opts := copyOptions{mode: spec.chmod}
	if spec.chown != "" {
		if opts.uid, opts.gid, err = lookupOwner(droot, spec.chown); err != nil {
			return err
		}
	}
	dest := strings.TrimLeft(path.Clean(spec.dest), "/")
	if dest == "" {
		dest = "."
	}
	intoDir := strings.HasSuffix(spec.dest, "/")
	if fi, err := droot.Stat(dest); err == nil && fi.IsDir() {
		intoDir = true
	}
	for _, src := range spec.sources {
		fi, err := sroot.Stat(src)
		if err != nil {
			return fmt.Errorf("source %s: %w", src, err)
		}
		target := dest
		if !fi.IsDir() && intoDir {
			target = path.Join(dest, path.Base(src))
		}
		if err := copyPath(ctx, sroot, src, droot, target, opts); err != nil {
			return fmt.Errorf("copying %s to %s: %w", src, spec.dest, err)
		}
	}
	return nil
}

// lookupOwner resolves "user[:group]" of --chown to numbers, reading names
// from the tree's /etc/passwd and /etc/group. A user without a group uses
// the same number for the group, as Docker does.
func lookupOwner(root *os.Root, spec string) (uid, gid int, err error) {
	user, group, hasGroup := strings.Cut(spec, ":")
	if uid, err = lookupID(root, "etc/passwd", user); err != nil {
		return 0, 0, err
	}
	if !hasGroup {
		return uid, uid, nil
	}
	if gid, err = lookupID(root, "etc/group", group); err != nil {
		return 0, 0, err
	}
	return uid, gid, nil
}

// lookupID returns the number of name, which is either a number or an
// entry of the colon-separated database file db ("name:x:id:...").
func lookupID(root *os.Root, db, name string) (int, error) {
	if n, err := strconv.Atoi(name); err == nil && n >= 0 {
		return n, nil
	}
	f, err := root.Open(db)
	if err != nil {
		return 0, fmt.Errorf("looking up %q: %w: %w", name, err, errdefs.ErrInvalidArgument)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Split(sc.Text(), ":")
		if len(fields) >= 3 && fields[0] == name {
			if n, err := strconv.Atoi(fields[2]); err == nil {
				return n, nil
			}
		}
	}
	return 0, fmt.Errorf("no %q in /%s: %w", name, db, errdefs.ErrInvalidArgument)
}
