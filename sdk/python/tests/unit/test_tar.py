import io
import os
import tarfile

import pytest

from corral import _tar


def test_round_trip(tmp_path):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "x.txt").write_text("X")
    (src / ".hidden").write_text("H")
    os.chmod(src / ".hidden", 0o600)
    os.symlink("sub/x.txt", src / "ln")
    dst = tmp_path / "dst"
    with _tar.pack(str(src)) as archive:
        _tar.extract(archive, str(dst))
    assert (dst / "sub" / "x.txt").read_text() == "X"
    assert (dst / ".hidden").read_text() == "H" and os.stat(dst / ".hidden").st_mode & 0o777 == 0o600
    assert os.readlink(dst / "ln") == "sub/x.txt"


def archive(*members):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    buf.seek(0)
    return buf


def entry(name, data=b"", kind=tarfile.REGTYPE, link=""):
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    return info, data if kind == tarfile.REGTYPE else None


@pytest.mark.parametrize(
    "members",
    [
        [entry("../escape", b"x")],
        [entry("/abs", b"x")],
        [entry("a/../../escape", b"x")],
        [entry("out", kind=tarfile.SYMTYPE, link="/"), entry("out/etc-file", b"x")],
        [entry("dev", kind=tarfile.CHRTYPE)],
        [entry("hard", kind=tarfile.LNKTYPE, link="/etc/passwd")],
    ],
)
def test_extract_refuses_hostile_archives(tmp_path, members):
    with pytest.raises(ValueError):
        _tar.extract(archive(*members), str(tmp_path / "dst"))
    assert not (tmp_path / "escape").exists()


def test_pack_wants_a_directory(tmp_path):
    with pytest.raises(NotADirectoryError):
        _tar.pack(str(tmp_path / "missing"))


def entry_mode(name, mode, data=b"", kind=tarfile.REGTYPE):
    info, data = entry(name, data, kind)
    info.mode = mode
    return info, data


def test_directory_entry_replaces_a_symlink_instead_of_following_it(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir(mode=0o700)
    dst = tmp_path / "dst"
    # The archive cannot make this link itself (it leads out); one already
    # in the target must not be followed by a directory entry either.
    dst.mkdir()
    os.symlink(str(outside), dst / "out")
    _tar.extract(archive(entry_mode("out", 0o777, kind=tarfile.DIRTYPE)), str(dst))
    assert os.stat(outside).st_mode & 0o777 == 0o700
    assert not os.path.islink(dst / "out") and os.path.isdir(dst / "out")


def test_directory_entry_replaces_a_symlink_the_archive_made(tmp_path):
    dst = tmp_path / "dst"
    (dst / "sub").mkdir(parents=True, mode=0o700)
    _tar.extract(archive(entry("ln", kind=tarfile.SYMTYPE, link="sub"), entry_mode("ln", 0o777, kind=tarfile.DIRTYPE)), str(dst))
    assert os.stat(dst / "sub").st_mode & 0o777 == 0o700
    assert not os.path.islink(dst / "ln") and os.stat(dst / "ln").st_mode & 0o777 == 0o755


@pytest.mark.parametrize("kind", [tarfile.REGTYPE, tarfile.DIRTYPE, tarfile.SYMTYPE])
def test_nothing_is_written_through_a_symlinked_parent(tmp_path, kind):
    outside = tmp_path / "outside"
    outside.mkdir()
    dst = tmp_path / "dst"
    dst.mkdir()
    os.symlink(str(outside), dst / "out")
    with pytest.raises(ValueError, match="symbolic link"):
        _tar.extract(archive(entry("out/x", b"x", kind=kind, link="y")), str(dst))
    assert os.listdir(outside) == []


def test_nothing_is_written_through_a_parent_the_archive_linked(tmp_path):
    dst = tmp_path / "dst"
    with pytest.raises(ValueError, match="symbolic link"):
        _tar.extract(archive(entry("sub", kind=tarfile.DIRTYPE), entry("ln", kind=tarfile.SYMTYPE, link="sub"), entry("ln/x", b"x")), str(dst))
    assert os.listdir(dst / "sub") == []


def test_file_entry_replaces_a_symlink(tmp_path):
    outside = tmp_path / "outside"
    outside.write_text("keep")
    dst = tmp_path / "dst"
    dst.mkdir()
    os.symlink(str(outside), dst / "f")
    _tar.extract(archive(entry("f", b"new")), str(dst))
    assert outside.read_text() == "keep"
    assert not os.path.islink(dst / "f") and (dst / "f").read_text() == "new"


def test_special_mode_bits_and_foreign_write_are_dropped(tmp_path):
    dst = tmp_path / "dst"
    _tar.extract(archive(entry_mode("d", 0o3777, kind=tarfile.DIRTYPE), entry_mode("d/suid", 0o6777, b"x"), entry_mode("ro", 0o444, b"y")), str(dst))
    assert os.stat(dst / "d").st_mode & 0o7777 == 0o755
    assert os.stat(dst / "d" / "suid").st_mode & 0o7777 == 0o755
    assert os.stat(dst / "ro").st_mode & 0o7777 == 0o444


@pytest.mark.parametrize(
    "name, link",
    [
        ("abs", "/etc"),
        ("up", ".."),
        ("sub/up2", "../.."),
        ("sub/through", "x/../../.."),
        ("later", "d/.."),
    ],
)
def test_symlinks_that_may_lead_outside_are_refused(tmp_path, name, link):
    dst = tmp_path / "dst"
    with pytest.raises(ValueError, match="lead outside"):
        _tar.extract(archive(entry(name, kind=tarfile.SYMTYPE, link=link)), str(dst))
    assert not os.path.lexists(dst / name)


def test_a_normal_archive_extracts(tmp_path):
    dst = tmp_path / "dst"
    _tar.extract(
        archive(
            entry("./", kind=tarfile.DIRTYPE),
            entry("./a", kind=tarfile.DIRTYPE),
            entry_mode("./a/run.sh", 0o755, b"#!/bin/sh\n"),
            entry("./a/b/c.txt", b"C"),
            entry("./a/b/up", kind=tarfile.SYMTYPE, link="../run.sh"),
            entry("./top", kind=tarfile.SYMTYPE, link="a/b/c.txt"),
            entry("./a/b/c.txt", b"C2"),
        ),
        str(dst),
    )
    assert (dst / "a" / "run.sh").read_text() == "#!/bin/sh\n" and os.stat(dst / "a" / "run.sh").st_mode & 0o777 == 0o755
    assert (dst / "a" / "b" / "up").read_text() == "#!/bin/sh\n"
    assert (dst / "top").read_text() == "C2"
    assert os.readlink(dst / "top") == "a/b/c.txt"
