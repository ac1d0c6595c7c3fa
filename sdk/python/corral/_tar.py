"""Tar streams for upload and download of directory trees."""

from __future__ import annotations

import os
import tarfile
import tempfile
from typing import IO, Any

# Archives up to this size stay in memory; larger ones spill to a
# temporary file.
SPOOL = 8 << 20


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


def _inside(root: str, path: str) -> bool:
    return path == root or path.startswith(root + os.sep)


def extract(fileobj: Any, local_dir: str) -> None:
    """Extracts an untrusted tar into local_dir: absolute names, ``..``,
    links, devices and anything that would be written through a symbolic
    link leading outside local_dir are refused with ValueError."""
    os.makedirs(local_dir, exist_ok=True)
    root = os.path.realpath(local_dir)
    with tarfile.open(fileobj=fileobj, mode="r|") as tar:
        for m in tar:
            name = m.name
            while name.startswith("./"):
                name = name[2:]
            name = name.rstrip("/")
            if name in ("", "."):
                continue
            if os.path.isabs(m.name) or ".." in m.name.split("/"):
                raise ValueError(f"archive entry {m.name!r} leaves the target directory")
            dest = os.path.join(root, name)
            parent = os.path.realpath(os.path.dirname(dest))
            if not _inside(root, parent):
                raise ValueError(f"archive entry {m.name!r} would be written through a link leading outside")
            if m.isdir():
                os.makedirs(dest, exist_ok=True)
                os.chmod(dest, (m.mode & 0o7777) | 0o700)
            elif m.isreg():
                os.makedirs(parent, exist_ok=True)
                if os.path.islink(dest):
                    os.unlink(dest)
                src = tar.extractfile(m)
                assert src is not None
                with open(dest, "wb") as f:
                    while True:
                        chunk = src.read(1 << 20)
                        if not chunk:
                            break
                        f.write(chunk)
                os.chmod(dest, m.mode & 0o7777)
            elif m.issym():
                os.makedirs(parent, exist_ok=True)
                if os.path.lexists(dest):
                    os.unlink(dest)
                os.symlink(m.linkname, dest)
            else:
                raise ValueError(f"archive entry {m.name!r} is of a type that is not extracted")
