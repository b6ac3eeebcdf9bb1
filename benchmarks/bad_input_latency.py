"""How long gbmw takes to answer each bad input of the corpus (tests/test_bad_inputs.py) with its one line.

    .venv/bin/python benchmarks/bad_input_latency.py              # the corpus, in-process
    .venv/bin/python benchmarks/bad_input_latency.py --launchers  # + whole commands under 2-process launchers

Issue 15's target is one clear line within a second (a few seconds under a launcher). Every case of the corpus
runs in-process through `gbmw.cli.main.main` in a fresh folder, as the test runs it; this prints the median and the
slowest cases, and the share answered within a second. `--launchers` also times three user errors as whole commands
(a new Python process, torch imported where the command needs it) alone, under gbmw's own launcher
(`--nproc-per-node 2`) and under `torchrun --standalone --nproc_per_node 2`, side by side in one run: a bad flag
(refused before torch starts), a missing plan file (refused by every rank before the process group starts) and a
plan with a bad field (read before the process group starts, refused after the ranks agree). Wall-clock, so it
lives here and not in the tests.
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

from gbmw.cli.main import main as gbmw_main  # noqa: E402

LAUNCHER_ERRORS = {
    "bad flag": ["train", "gpt-tiny_cpu-x4", "--steps", "1"],
    "missing plan file": ["train", "gpt-tiny_cpu-x4", "--plan", "no-such-plan.yaml", "--steps", "1"],
    "bad plan field": ["train", "gpt-tiny_cpu-x4", "--plan", "bad-plan.yaml", "--steps", "1"],
}


def time_under_launchers(repeats: int = 3) -> None:
    """Median wall seconds of each LAUNCHER_ERRORS command alone, under gbmw's launcher and under torchrun."""
    import subprocess

    bin_folder = Path(sys.executable).parent
    launchers = {"alone": [sys.executable, "-m", "gbmw"],
                 "gbmw --nproc-per-node 2": [sys.executable, "-m", "gbmw"],
                 "torchrun --nproc_per_node 2": [str(bin_folder / "torchrun"), "--standalone", "--nproc_per_node", "2",
                                                 "-m", "gbmw"]}
    environment = dict(os.environ, OMP_NUM_THREADS="1")
    with tempfile.TemporaryDirectory() as folder:
        text = _two_device_plan_text()
        Path(folder, "bad-plan.yaml").write_text(text.replace("num_micro_batches: 2", "num_micro_batches: -2"))
        print(f"{'user error':<20}" + "".join(f"{name:>30}" for name in launchers))
        for error, argv in LAUNCHER_ERRORS.items():
            row = []
            for name, command in launchers.items():
                extra = ["--nproc-per-node", "2"] if name.startswith("gbmw") else []
                seconds = []
                for _ in range(repeats):
                    started = time.perf_counter()
                    done = subprocess.run(command + argv + extra, cwd=folder, env=environment, capture_output=True,
                                          text=True, timeout=300)
                    seconds.append(time.perf_counter() - started)
                lines = sum("gbmw: error:" in line for line in (done.stdout + done.stderr).splitlines())
                row.append(f"{statistics.median(seconds):6.2f} s, exit {done.returncode}, {lines} line(s)")
            print(f"{error:<20}" + "".join(f"{cell:>30}" for cell in row))


def _two_device_plan_text() -> str:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
    from runtime_reference import make_plan

    return make_plan("gpt-tiny", 2, ["dp2"] * 6, [6], 16, 2).to_yaml()


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
    if "--launchers" in sys.argv[1:]:
        time_under_launchers()
    return 0


if __name__ == "__main__":
    sys.exit(main())
