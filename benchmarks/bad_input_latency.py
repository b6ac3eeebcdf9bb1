"""How long gbmw takes to answer each bad input of the corpus (tests/test_bad_inputs.py) with its one line.

    .venv/bin/python benchmarks/bad_input_latency.py

Issue 15's target is one clear line within a second. Every case of the corpus runs in-process through
`gbmw.cli.main` in a fresh folder, as the test runs it; this prints the median and the slowest cases, and the
share answered within a second. Wall-clock, so it lives here and not in the tests.
"""

from __future__ import annotations

import contextlib
import io
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

from test_bad_inputs import CASES, write_files  # noqa: E402

from gbmw.cli import main as gbmw_main  # noqa: E402


def main() -> int:
    timings: list[tuple[float, str, int]] = []
    for name, argv, _, files in CASES:
        with tempfile.TemporaryDirectory() as folder:
            write_files(Path(folder), files)
            argv = [part.replace("{d}", folder) for part in argv]
            started = time.perf_counter()
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                status = gbmw_main(argv)
            timings.append((time.perf_counter() - started, name, status))
    seconds = [t for t, _, _ in timings]
    within = sum(t <= 1.0 for t in seconds) / len(seconds)
    print(f"{len(seconds)} bad inputs: median {statistics.median(seconds) * 1e3:.0f} ms, "
          f"slowest {max(seconds):.2f} s, {within:.0%} within a second, "
          f"{sum(status == 2 for _, _, status in timings)} exited 2")
    for took, name, status in sorted(timings, reverse=True)[:5]:
        print(f"  {name}: {took:.2f} s (exit {status})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
