"""A PEP 517 build backend for the corral package that needs nothing
beyond the standard library, so that ``pip install ./sdk/python`` works
on a machine without a package index (a backend from an index, such as
setuptools, would have to be downloaded into pip's isolated build
environment first).

It builds a pure-Python wheel of the ``corral`` directory with the
metadata of pyproject.toml's ``[project]`` table, an editable wheel (a
``.pth`` file naming this directory), and an sdist.
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import re
import tarfile
import zipfile
from typing import Any, Dict, List, Optional, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "corral"


def _project() -> Dict[str, Any]:
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        text = f.read().decode("utf-8")
    try:
        import tomllib  # Python 3.11+
    except ImportError:
        return _project_fallback(text)
    return tomllib.loads(text)["project"]


def _project_fallback(text: str) -> Dict[str, Any]:
    """Reads the string and string-array keys of [project], the only
    shapes its metadata uses, where tomllib is missing (Python < 3.11)."""
    m = re.search(r"^\[project\]\s*$(.*?)(?=^\[)", text, re.M | re.S)
    if m is None:
        raise ValueError("pyproject.toml has no [project] table")
    out: Dict[str, Any] = {}
    for key, value in re.findall(r'^([A-Za-z-]+)\s*=\s*(".*?"|\[.*?\])', m.group(1), re.M | re.S):
        if value.startswith("["):
            out[key] = re.findall(r'"(.*?)"', value)
        else:
            out[key] = value[1:-1]
    return out


def _metadata() -> str:
    p = _project()
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {p['name']}",
        f"Version: {p['version']}",
        f"Summary: {p.get('description', '')}",
    ]
    if p.get("requires-python"):
        lines.append(f"Requires-Python: {p['requires-python']}")
    for c in p.get("classifiers", []):
        lines.append(f"Classifier: {c}")
    for d in p.get("dependencies", []):
        lines.append(f"Requires-Dist: {d}")
    readme = os.path.join(ROOT, "README.md")
    body = ""
    if os.path.exists(readme):
        lines.append("Description-Content-Type: text/markdown")
        with open(readme, encoding="utf-8") as f:
            body = f.read()
    return "\n".join(lines) + "\n\n" + body


def _name_version() -> Tuple[str, str]:
    p = _project()
    return p["name"], p["version"]


def _package_files() -> List[str]:
    out = []
    for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, PACKAGE)):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(filenames):
            if name.endswith((".py", ".typed")):
                out.append(os.path.relpath(os.path.join(dirpath, name), ROOT))
    return out


def _write_wheel(wheel_directory: str, files: List[Tuple[str, bytes]]) -> str:
    name, version = _name_version()
    dist_info = f"{name}-{version}.dist-info"
    wheel_name = f"{name}-{version}-py3-none-any.whl"
    files = files + [
        (f"{dist_info}/METADATA", _metadata().encode("utf-8")),
        (f"{dist_info}/WHEEL", b"Wheel-Version: 1.0\nGenerator: corral_build\nRoot-Is-Purelib: true\nTag: py3-none-any\n"),
    ]
    record = io.StringIO()
    with zipfile.ZipFile(os.path.join(wheel_directory, wheel_name), "w", zipfile.ZIP_DEFLATED) as zf:
        for arcname, data in files:
            zf.writestr(arcname, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode("ascii")
            record.write(f"{arcname},sha256={digest},{len(data)}\n")
        record.write(f"{dist_info}/RECORD,,\n")
        zf.writestr(f"{dist_info}/RECORD", record.getvalue())
    return wheel_name


def get_requires_for_build_wheel(config_settings: Optional[Dict[str, Any]] = None) -> List[str]:
    return []


def get_requires_for_build_sdist(config_settings: Optional[Dict[str, Any]] = None) -> List[str]:
    return []


def get_requires_for_build_editable(config_settings: Optional[Dict[str, Any]] = None) -> List[str]:
    return []


def build_wheel(wheel_directory: str, config_settings: Any = None, metadata_directory: Any = None) -> str:
    files = []
    for rel in _package_files():
        with open(os.path.join(ROOT, rel), "rb") as f:
            files.append((rel.replace(os.sep, "/"), f.read()))
    return _write_wheel(wheel_directory, files)


def build_editable(wheel_directory: str, config_settings: Any = None, metadata_directory: Any = None) -> str:
    return _write_wheel(wheel_directory, [(f"_{PACKAGE}_editable.pth", (ROOT + "\n").encode("utf-8"))])


def build_sdist(sdist_directory: str, config_settings: Any = None) -> str:
    name, version = _name_version()
    base = f"{name}-{version}"
    out = f"{base}.tar.gz"
    with tarfile.open(os.path.join(sdist_directory, out), "w:gz") as tar:
        for rel in ["pyproject.toml", "README.md", "build_backend/corral_build.py"] + _package_files():
            if os.path.exists(os.path.join(ROOT, rel)):
                tar.add(os.path.join(ROOT, rel), arcname=f"{base}/{rel}")
        info = tarfile.TarInfo(f"{base}/PKG-INFO")
        data = _metadata().encode("utf-8")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return out
