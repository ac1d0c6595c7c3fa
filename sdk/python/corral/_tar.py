"""Tar streams for upload and download of directory trees."""

from __future__ import annotations

import os
import stat
import tarfile
import tempfile
from typing import IO, Any, List

# Archives up to this size stay in memory; larger ones spill to a
# temporary file.
SPOOL = 8 << 20

# The permission bits extract keeps: no setuid, setgid or sticky bit, no
# write permission for group and others.
_MODE = 0o755

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def pack(local_dir: str) -> IO[bytes]:
    """Returns a tar of the contents of local_dir (names relative to it),
    rewound. Regular files, directories and symbolic links (as links) are
    stored with their permission bits and times; owners and other file
    types are not."""
    if not os.path.isdir(local_dir):
        raise NotADirectoryError(f"{local_dir!r} is not a directory")
    out = tempfile.SpooledTemporaryFile(max_size=SPOOL)
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for root, dirs, files in os.walk(local_dir):
            dirs.sort()
            for name in sorted(dirs) + sorted(files):
                full = os.path.join(root, name)
                if not (os.path.islink(full) or os.path.isfile(full) or os.path.isdir(full)):
                    continue
                info = tar.gettarinfo(full, arcname=os.path.relpath(full, local_dir))
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                if info.isreg():
                    with open(full, "rb") as f:
                        tar.addfile(info, f)
                else:
                    tar.addfile(info)
    out.seek(0)
    return out  # type: ignore[return-value]


def _parts(name: str) -> List[str]:
    return [p for p in name.split("/") if p not in ("", ".")]


def _link_ok(link_parent: List[str], target: str) -> bool:
    """Whether a symbolic link in the directory link_parent (components
    below the target) pointing to target stays inside the target whatever
    the other links extracted do: target is relative and made of ``..``
    steps, no more than link_parent is deep, followed by names only. By
    induction every link such an archive makes resolves inside, because
    each name after the ``..`` steps is a directory, or a link that itself
    resolves inside."""
    if target.startswith("/"):
        return False
    parts = _parts(target)
    up = 0
    while up < len(parts) and parts[up] == "..":
        up += 1
    return up <= len(link_parent) and ".." not in parts[up:]


def _real_dir(path: str, entry: str) -> None:
    """Makes sure path is a directory that is not a symbolic link,
    creating it if missing."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        os.mkdir(path, 0o755)
        return
    if stat.S_ISLNK(st.st_mode):
        raise ValueError(f"archive entry {entry!r} would be written through the symbolic link {path!r}")
    if not stat.S_ISDIR(st.st_mode):
        raise ValueError(f"archive entry {entry!r} needs {path!r} to be a directory")


def _clear(path: str) -> None:
    """Removes what is at path unless it is a directory, so that a new
    entry never writes through a link (symbolic or hard) found there."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(path)


def extract(fileobj: Any, local_dir: str) -> None:
    """Extracts an untrusted tar into local_dir, refusing with ValueError
    (after extracting the entries before it) any entry that is absolute,
    contains ``..``, is a hard link, a device or another special file, or
    would be written through a symbolic link (one the archive made or one
    already in local_dir), and any symbolic link that is absolute or could
    resolve outside local_dir (see _link_ok).

    Permission bits are kept without setuid, setgid and sticky bits and
    without write permission for group and others; directories stay
    writable by their owner. Owners are not restored."""
    os.makedirs(local_dir, exist_ok=True)
    root = os.path.realpath(local_dir)
    with tarfile.open(fileobj=fileobj, mode="r|") as tar:
        for m in tar:
            if os.path.isabs(m.name) or ".." in m.name.split("/"):
                raise ValueError(f"archive entry {m.name!r} leaves the target directory")
            parts = _parts(m.name)
            if not parts:
                continue
            if not (m.isdir() or m.isreg() or m.issym()):
                raise ValueError(f"archive entry {m.name!r} is of a type that is not extracted")
            if m.issym() and not _link_ok(parts[:-1], m.linkname):
                raise ValueError(f"archive entry {m.name!r} links to {m.linkname!r}, which may lead outside the target directory")
            parent = root
            for p in parts[:-1]:
                parent = os.path.join(parent, p)
                _real_dir(parent, m.name)
            dest = os.path.join(parent, parts[-1])
            mode = m.mode & _MODE
            if m.isdir():
                _clear(dest)
                _real_dir(dest, m.name)
                os.chmod(dest, mode | 0o700)
            elif m.isreg():
                _clear(dest)
                src = tar.extractfile(m)
                assert src is not None
                fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o600)
                with os.fdopen(fd, "wb") as f:
                    while True:
                        chunk = src.read(1 << 20)
                        if not chunk:
                            break
                        f.write(chunk)
                    os.fchmod(f.fileno(), mode)
            else:
                _clear(dest)
                os.symlink(m.linkname, dest)
