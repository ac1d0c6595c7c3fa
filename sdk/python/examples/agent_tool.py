"""A tool an LLM agent calls to run Python code in a fresh sandbox.

`run_python` is a plain function with a docstring and type hints, the
shape LangGraph, the OpenAI Agents SDK, CrewAI and smolagents turn into a
tool; `TOOL_SCHEMA` is the same tool as a JSON schema for frameworks (or
raw chat-completion APIs) that take one. Each call gets its own sandbox
with no network, deleted as soon as the code ends.

    python3 agent_tool.py 'print(sum(range(10)))'
"""

import os
import sys

import corral

TEMPLATE = os.environ.get("CORRAL_TEMPLATE", "default")
_client = corral.Client()


def run_python(code: str, timeout_seconds: float = 30) -> str:
    """Runs Python code in a fresh, isolated sandbox and returns what it
    printed (stdout, then stderr) and its exit status."""
    try:
        result = _client.run(
            ["python3", "-c", code], template=TEMPLATE, network="none", memory_mb=512, timeout=timeout_seconds
        )
    except corral.Busy as e:
        return f"error: the sandbox service is busy; try again in {e.retry_after or 1:.0f} s"
    except corral.CorralError as e:
        return f"error: {e}"
    parts = [result.stdout]
    if result.stderr:
        parts.append("stderr:\n" + result.stderr)
    if result.timed_out:
        parts.append(f"(stopped after {timeout_seconds} s)")
    parts.append(f"exit status {result.exit_code}")
    return "\n".join(p for p in parts if p)


TOOL_SCHEMA = {
    "type": "function",
    "function": {
        "name": "run_python",
        "description": run_python.__doc__,
        "parameters": {
            "type": "object",
            "properties": {
                "code": {"type": "string", "description": "Python source to run"},
                "timeout_seconds": {"type": "number", "description": "stop the code after this long"},
            },
            "required": ["code"],
        },
    },
}


if __name__ == "__main__":
    print(run_python(sys.argv[1] if len(sys.argv) > 1 else "print(6 * 7)"))
