"""The examples in sdk/python/examples, run as a user would run them."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from .conftest import needs

SDK = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_example(name: str, template: str, *args: str) -> str:
    env = dict(os.environ, CORRAL_TEMPLATE=template, PYTHONPATH=SDK)
    proc = subprocess.run([sys.executable, os.path.join(SDK, "examples", name), *args], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{name} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def test_one_liner(client, template):
    assert run_example("one_liner.py", template).endswith("exit code: 0\n")


def test_streaming_exec(client, template):
    out = run_example("streaming_exec.py", template)
    assert "stdout: step 1\nstdout: step 2\nstdout: step 3\n" in out
    assert "live: tick 1\n" in out and "tick 4\n" in out and out.endswith("exit code: 0\n")


@pytest.mark.code
def test_agent_tool(client):
    template = needs("CORRAL_TEST_CODE_TEMPLATE")
    out = run_example("agent_tool.py", template, "import sys; print(6 * 7); sys.exit('boom')")
    assert out == "42\n\nstderr:\nboom\n\nexit status 1\n"


@pytest.mark.code
def test_chart_example(client, tmp_path):
    template = needs("CORRAL_TEST_CODE_TEMPLATE")
    png = tmp_path / "chart.png"
    out = run_example("code_interpreter_chart.py", template, str(png))
    assert "last value: 1.0" in out
    assert png.read_bytes().startswith(b"\x89PNG")
