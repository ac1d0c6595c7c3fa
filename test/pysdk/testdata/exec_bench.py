"""Times the Python SDK's exec round trip for BenchmarkExecRoundTrip.

Usage: exec_bench.py HOST SANDBOX_ID. Each line read from stdin is a
count N: the script runs `true` N times in the sandbox through one
client and answers with one line, the N durations in nanoseconds.
"""

import json
import sys
import time

import corral


def main() -> None:
    host, sandbox_id = sys.argv[1], sys.argv[2]
    with corral.Client(host) as client:
        sb = client.get(sandbox_id)
        for line in sys.stdin:
            samples = []
            for _ in range(int(line)):
                start = time.perf_counter_ns()
                res = sb.exec(["true"])
                samples.append(time.perf_counter_ns() - start)
                if res.exit_code != 0:
                    sys.exit(f"true exited with {res.exit_code}")
            print(json.dumps(samples), flush=True)


if __name__ == "__main__":
    main()
