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
