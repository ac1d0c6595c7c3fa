"""A code-interpreter session: state kept between runs, and a
matplotlib chart saved to a PNG file.

Needs a template made with `corral template build code-interpreter
--recipe code-interpreter`.
"""

import os
import sys

import corral

TEMPLATE = os.environ.get("CORRAL_TEMPLATE", "code-interpreter")
OUT = sys.argv[1] if len(sys.argv) > 1 else "chart.png"

with corral.Client() as client, client.create(template=TEMPLATE, memory_mb=1024) as sb:
    sb.run_code("import numpy as np\nxs = np.linspace(0, 6.3, 50)")
    # Variables stay between runs of one context.
    run = sb.run_code(
        "import matplotlib.pyplot as plt\n"
        "plt.plot(xs, np.sin(xs))\n"
        "plt.title('sine')\n"
        "plt.show()\n"
        "round(float(np.sin(xs).max()), 3)"
    )
    if run.error:
        sys.exit(f"{run.error.name}: {run.error.value}\n{run.error.traceback}")
    print("last value:", run.text)
    for result in run.results:
        if result.png:
            with open(OUT, "wb") as f:
                f.write(result.png)
            print(f"chart saved to {OUT} ({len(result.png)} bytes)")
