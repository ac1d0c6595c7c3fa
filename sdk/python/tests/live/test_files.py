"""sb.files against a live daemon."""

from __future__ import annotations

import os
import threading
import time

import pytest

import corral


def test_read_write_list_stat(sb):
    info = sb.files.write("/work/dir/a.txt", "héllo", mode=0o640)
    assert info.path == "/work/dir/a.txt" and info.size == len("héllo".encode()) and info.mode & 0o777 == 0o640
    assert sb.files.read("/work/dir/a.txt") == "héllo".encode()
    assert sb.files.read_text("/work/dir/a.txt") == "héllo"
    sb.files.write("/work/dir/b.bin", bytes(range(256)))
    assert sb.files.read("/work/dir/b.bin") == bytes(range(256))
    assert [f.name for f in sb.files.list("/work/dir")] == ["a.txt", "b.bin"]
    assert sb.files.stat("/work/dir").is_dir
    assert sb.files.exists("/work/dir/a.txt") and not sb.files.exists("/work/nope")
    with pytest.raises(corral.NotFound):
        sb.files.read("/work/nope")


def test_write_streams_a_file_object(sb, tmp_path):
    local = tmp_path / "big"
    local.write_bytes(os.urandom(3 << 20))
    with open(local, "rb") as f:
        assert sb.files.write("/big", f).size == 3 << 20
    assert sb.files.read("/big") == local.read_bytes()


def test_mkdir_rename_remove(sb):
    assert sb.files.mkdir("/m/n/o").is_dir
    with pytest.raises(corral.CorralError):
        sb.files.mkdir("/x/y", parents=False)
    sb.files.write("/m/n/o/f", "1")
    assert sb.files.rename("/m/n/o/f", "/m/g").path == "/m/g"
    assert not sb.files.exists("/m/n/o/f")
    sb.files.remove("/m/g")
    with pytest.raises(corral.CorralError):
        sb.files.remove("/m")  # not empty
    sb.files.remove("/m", recursive=True)
    assert not sb.files.exists("/m")


def test_upload_download(sb, tmp_path):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "x.txt").write_text("X")
    (src / "run.sh").write_text("#!/bin/sh\necho ran\n")
    os.chmod(src / "run.sh", 0o755)
    os.symlink("sub/x.txt", src / "link")
    sb.files.upload(str(src), "/up")
    assert sb.exec(["/up/run.sh"]).stdout == "ran\n"
    assert sb.files.stat("/up/link").type == "symlink"
    dst = tmp_path / "dst"
    sb.files.download("/up", str(dst))
    assert (dst / "sub" / "x.txt").read_text() == "X"
    assert os.access(dst / "run.sh", os.X_OK) and os.readlink(dst / "link") == "sub/x.txt"


def test_watch(sb):
    sb.files.mkdir("/watched")
    stop = threading.Event()

    def touch() -> None:
        for i in range(25):
            if stop.wait(0.2):
                return
            sb.files.write(f"/watched/f{i}", "x")

    writer = threading.Thread(target=touch)
    with sb.files.watch("/watched") as events:
        writer.start()
        try:
            ev = next(iter(events))
        finally:
            stop.set()
            writer.join()
    assert ev.path.startswith("/watched/f") and ev.type in ("create", "write")
