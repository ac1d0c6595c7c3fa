"""Stream a command's output as it is written, then follow a background
process, leave it, and come back to it by PID."""

import os
import sys

import corral

TEMPLATE = os.environ.get("CORRAL_TEMPLATE", "default")

with corral.Client() as client, client.create(template=TEMPLATE, timeout=300) as sb:
    # Output reaches the callbacks line by line while the command runs.
    result = sb.exec(
        "for i in 1 2 3; do echo step $i; sleep 0.5; done; echo done >&2",
        on_stdout=lambda text: print("stdout:", text, end=""),
        on_stderr=lambda text: print("stderr:", text, end="", file=sys.stderr),
    )
    print("exit code:", result.exit_code)

    # A background process belongs to the sandbox, not to this call.
    proc = sb.spawn("for i in 1 2 3 4; do echo tick $i; sleep 0.3; done")
    seen = 0
    with proc.output(follow=True) as stream:
        for chunk in stream:
            print("live:", chunk.text, end="")
            seen = stream.next_offset
            break  # leave after the first chunk; the process keeps running
    # Any client can pick up where this one left, without gaps or repeats.
    rest = b"".join(chunk.data for chunk in proc.output(seen, follow=True))
    print("the rest:", rest.decode(), end="")
    print("exit code:", proc.wait().exit_code)
