"""Create a sandbox, run one command, delete it: one call.

    CORRAL_HOST=unix:///run/corral/corral.sock python3 one_liner.py
"""

import os

import corral

TEMPLATE = os.environ.get("CORRAL_TEMPLATE", "default")

result = corral.Client().run("echo hello from $(uname -n)", template=TEMPLATE)
print(result.stdout, end="")
print("exit code:", result.exit_code)
