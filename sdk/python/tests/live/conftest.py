"""Fixtures of the tests against a live daemon.

They run when CORRAL_HOST names a daemon and skip otherwise, except under
CORRAL_TEST_REQUIRE=1, where a missing daemon or setting fails them
(``needs``). Every sandbox they make carries the metadata
``pytest=<run ID>``; at the end of the session none may be left, and on a
daemon that serves only the tests (CORRAL_TEST_DEDICATED=1, as test/pysdk
starts it) no sandbox at all, whoever made it.

Settings: CORRAL_TEST_TEMPLATE (default ``busybox``), CORRAL_TEST_RUNTIME
(default: the daemon's), CORRAL_TEST_CODE_TEMPLATE (a code-interpreter
template, for the tests marked ``code``), CORRAL_TEST_TCP_HOST and
CORRAL_TEST_TCP_KEY (the daemon's TCP listener and its key), and
CORRAL_TEST_MEMORY_COMMIT_RATIO (the daemon's --memory-commit-ratio, for
the admission test).
"""

from __future__ import annotations

import os
import uuid
from typing import Any, Callable, Iterator, List

import pytest

import corral

REQUIRED = os.environ.get("CORRAL_TEST_REQUIRE") == "1"


def needs(name: str) -> str:
    """The setting name; without it the test skips, or fails under
    CORRAL_TEST_REQUIRE=1."""
    value = os.environ.get(name, "")
    if not value:
        if REQUIRED:
            pytest.fail(f"{name} is not set and CORRAL_TEST_REQUIRE=1")
        pytest.skip(f"{name} is not set")
    return value


@pytest.fixture(scope="session")
def run_id() -> str:
    return uuid.uuid4().hex[:12]


@pytest.fixture(scope="session")
def meta(run_id: str) -> dict:
    return {"pytest": run_id}


@pytest.fixture(scope="session")
def client(meta: dict) -> Iterator[corral.Client]:
    host = needs("CORRAL_HOST")
    with corral.Client(host) as c:
        yield c
        left = c.list(metadata=meta)
        if os.environ.get("CORRAL_TEST_DEDICATED") == "1":
            left = c.list()
        for sb in left:
            sb.kill()
        assert not left, f"tests left sandboxes behind: {[sb.id for sb in left]}"


@pytest.fixture(scope="session")
def template() -> str:
    return os.environ.get("CORRAL_TEST_TEMPLATE") or "busybox"


@pytest.fixture(scope="session")
def runtime() -> Any:
    return os.environ.get("CORRAL_TEST_RUNTIME") or None


@pytest.fixture
def new_sandbox(client: corral.Client, template: str, runtime: Any, meta: dict) -> Iterator[Callable[..., corral.Sandbox]]:
    """Creates sandboxes of the test's template and runtime, deleted at
    the end of the test."""
    made: List[corral.Sandbox] = []

    def make(**kwargs: Any) -> corral.Sandbox:
        kwargs.setdefault("template", template)
        kwargs.setdefault("runtime", runtime)
        kwargs["metadata"] = {**meta, **kwargs.get("metadata", {})}
        sb = client.create(**kwargs)
        made.append(sb)
        return sb

    yield make
    for sb in made:
        try:
            sb.kill()
        except corral.NotFound:
            pass


@pytest.fixture
def sb(new_sandbox: Callable[..., corral.Sandbox]) -> corral.Sandbox:
    return new_sandbox()
