"""run_code against a sandbox of a code-interpreter template."""

from __future__ import annotations

import pytest

import corral

from .conftest import needs

pytestmark = pytest.mark.code


@pytest.fixture(scope="module")
def code_template() -> str:
    return needs("CORRAL_TEST_CODE_TEMPLATE")


@pytest.fixture
def csb(new_sandbox, code_template, runtime):
    sb = new_sandbox(template=code_template, memory_mb=1024)
    if runtime:
        assert sb.runtime == runtime
    return sb


CHART = """
import matplotlib.pyplot as plt
plt.plot([1, 2, 3], [1, 4, 9])
plt.title("squares")
plt.show()
"""


def test_run_code(csb, tmp_path):
    printed = []
    x = csb.run_code("print('hi')\n6 * 7", on_stdout=printed.append)
    assert x.text == "42" and x.stdout == ["hi\n"] and printed == ["hi\n"] and x.error is None

    x = csb.run_code(CHART)
    pngs = [r.png for r in x.results if r.png]
    assert pngs and pngs[0].startswith(b"\x89PNG\r\n\x1a\n")
    (tmp_path / "chart.png").write_bytes(pngs[0])
    assert any(r.chart and r.chart.get("title") == "squares" for r in x.results)

    x = csb.run_code("1 / 0")
    assert x.error is not None and x.error.name == "ZeroDivisionError"


def test_contexts(csb):
    ctx = csb.create_code_context("python", cwd="/tmp")
    assert ctx.id in [c.id for c in csb.code_contexts()]
    csb.run_code("secret = 41", context=ctx)
    assert csb.run_code("secret + 1", context=ctx).text == "42"
    assert csb.run_code("import os; print(os.getcwd())", context=ctx.id).stdout == ["/tmp\n"]
    csb.restart_code_context(ctx)
    assert csb.run_code("secret", context=ctx).error.name == "NameError"
    csb.delete_code_context(ctx)
    with pytest.raises(corral.NotFound):
        csb.run_code("1", context=ctx)


def test_run_code_needs_an_interpreter(sb):
    with pytest.raises(corral.FailedPrecondition):
        sb.run_code("1")


async def test_async_run_code(client, csb):
    async with corral.AsyncClient(client.host) as ac:
        asb = await ac.get(csb.id)
        results = []
        x = await asb.run_code("print(1)\n2 * 2", on_result=results.append)
        assert x.stdout == ["1\n"] and x.text == "4" and results[0].text == "4"
