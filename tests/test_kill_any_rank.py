"""Issue 31's faults: any rank of `gbmw train --nproc-per-node` killed at any moment — mid-step or mid-save, by SIGKILL
or SIGTERM. Every process is gone within 5 s, the user reads one line, the checkpoints `--save-every` wrote are
complete, and `--load` resumes from the latest with the losses of a run that was never stopped."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from runtime_reference import make_plan  # noqa: E402

from gbmw.adapters.runtime.partial_saves import MARKER, marker_text  # noqa: E402
from test_launcher_errors import _alive, _descendants  # noqa: E402

pytestmark = [pytest.mark.dist, pytest.mark.serial,  # GONE_WITHIN_S is timed: `make test` runs these alone
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads worker ranks from /proc")]

BIN = Path(sys.executable).parent
JOB = "gpt-tiny_cpu-x4"
GONE_WITHIN_S = 5.0


def _start(tmp_path: Path, *arguments: str) -> subprocess.Popen:
    environment = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}", OMP_NUM_THREADS="1",
                       PYTHONUNBUFFERED="1")
    return subprocess.Popen([str(BIN / "gbmw"), "train", JOB, "--plan", "plan.yaml", *arguments,
                             "--nproc-per-node", "2"], cwd=tmp_path, env=environment, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _worker_ranks(launcher: subprocess.Popen) -> dict[int, int]:
    """rank -> pid of the launcher's workers (their RANK from /proc/PID/environ)."""
    ranks = {}
    for pid in _descendants(launcher.pid):
        try:
            environment = dict(item.split("=", 1) for item in
                               Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in item)
        except OSError:
            continue
        if "RANK" in environment and "gbmw" in Path(f"/proc/{pid}/cmdline").read_text():
            ranks[int(environment["RANK"])] = pid
    return ranks


def _kill_and_wait(launcher: subprocess.Popen, victim_pid: int, signal_number: int) -> tuple[int, str]:
    """Send the signal to one worker; every process of the run must be gone within GONE_WITHIN_S."""
    everyone = _descendants(launcher.pid) | {launcher.pid}
    os.kill(victim_pid, signal_number)
    deadline = time.monotonic() + GONE_WITHIN_S
    while time.monotonic() < deadline and (_alive(everyone) or launcher.poll() is None):
        time.sleep(0.05)
    left = _alive(everyone)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"processes {sorted(left)} still ran {GONE_WITHIN_S} s after a worker was killed"
    return launcher.wait(timeout=30), launcher.stderr.read()


def _marked(folder: Path) -> bool:
    """Whether a save's temporary folder holds its whole marker (partial_saves.mark_as_ours has written it)."""
    try:
        text = (folder / MARKER).read_text()
    except OSError:
        return False
    return text.startswith("gbmw partial checkpoint\n") and text.count("\n") == marker_text("").count("\n")


def _losses(output: str) -> dict[int, str]:
    return {int(step): loss for step, loss in re.findall(r"^step +(\d+)/\d+ +loss (\S+)", output, re.MULTILINE)}


@pytest.mark.parametrize(("victim", "signal_number"), [(0, signal.SIGKILL), (1, signal.SIGTERM)])
def test_a_rank_killed_mid_step_ends_the_run_in_one_line(tmp_path, victim, signal_number):
    """Before: each survivor printed its own "lost contact" line, then the launcher another. Catches: a survivor
    left running (a hang in a collective), more than one line, a traceback."""
    (tmp_path / "plan.yaml").write_text(make_plan("gpt-tiny", 2, ["dp2"] * 6, [6], 16, 2).to_yaml())
    launcher = _start(tmp_path, "--steps", "100000")
    try:
        for line in launcher.stdout:
            if line.startswith("step ") and line.split()[1].startswith("2/"):
                break
        status, err = _kill_and_wait(launcher, _worker_ranks(launcher)[victim], signal_number)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    lines = err.splitlines()
    assert status == 1 and len(lines) == 1, err[-3000:]
    assert lines[0].startswith(f"gbmw: error: rank {1 - victim}: lost contact with another process during step "), err
    assert lines[0].endswith(f"was saved. (rank {victim} of 2 ended with signal {int(signal_number)}, "
                             f"{signal.Signals(signal_number).name})"), err


@pytest.mark.parametrize(("victim", "signal_number"), [(0, signal.SIGKILL), ("launcher", signal.SIGTERM)])
def test_a_kill_mid_save_leaves_complete_checkpoints_that_resume_exactly(tmp_path, victim, signal_number):
    """Two pipeline stages, each writing its own layers, save every step; a worker is SIGKILLed (or the launcher
    SIGTERMed) the moment a save's temporary folder holds its whole marker (a kill between creating the folder and
    marking it leaves an unmarked folder, which by design no load removes: partial_saves). The step folders are whole
    checkpoints (a kill never leaves one under its final name),
    the next `--load` of the folder reports and removes the interrupted save and resumes from the latest step, and the
    losses after it equal, to the printed digit, those of one uninterrupted run (same plan, same processes: the same
    arithmetic). Catches: a step folder renamed before every stage wrote its layers, a load that misreads the
    leftover, a resume from anything but the latest complete step, a resumed state that differs (data position, Adam
    moments, step counter)."""
    (tmp_path / "plan.yaml").write_text(make_plan("gpt-tiny", 2, ["single"] * 6, [3, 3], 16, 2).to_yaml())
    series = tmp_path / "ck"
    launcher = _start(tmp_path, "--steps", "100000", "--save", "ck", "--save-every", "1")
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and launcher.poll() is None:
            names = [entry.name for entry in os.scandir(series)] if series.is_dir() else []
            if "step-00000002" in names and any(_marked(series / name) for name in names if name.startswith(".step-")):
                break
            time.sleep(0.001)
        else:
            pytest.fail("no save in progress was seen")
        pid = launcher.pid if victim == "launcher" else _worker_ranks(launcher)[victim]
        status, err = _kill_and_wait(launcher, pid, signal_number)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert len(err.splitlines()) == 1 and f"signal {int(signal_number)}" in err, err[-3000:]
    assert status == (128 + signal_number if victim == "launcher" else 1), err
    steps = sorted(int(entry.name[5:]) for entry in series.iterdir() if entry.name.startswith("step-"))
    assert steps == list(range(1, steps[-1] + 1)) and all((series / f"step-{step:08d}" / "checkpoint.yaml").is_file()
                                                          for step in steps)
    latest = steps[-1]

    resumed = _start(tmp_path, "--steps", "2", "--load", "ck")
    out, err = resumed.communicate(timeout=180)
    assert resumed.returncode == 0, err[-3000:]
    assert f"resuming from the latest complete one, step-{latest:08d}" in out, out
    assert not [entry.name for entry in series.iterdir() if entry.name.startswith(".")], "a leftover stayed"
    reference = _start(tmp_path, "--steps", str(latest + 2))
    reference_out, reference_err = reference.communicate(timeout=180)
    assert reference.returncode == 0, reference_err[-3000:]
    expected = _losses(reference_out)
    assert _losses(out) == {step: expected[step] for step in (latest + 1, latest + 2)}, out + reference_out


def test_under_torchrun_one_survivor_reports_a_killed_rank(tmp_path):
    """Four ranks under torchrun, rank 0 (the one that prints) SIGKILLed: of the three survivors only the first to
    find it gone prints its line — they count reports in torchrun's key-value store (adapters/runtime/launch.py) —
    and torchrun's own failure table follows as torchrun prints it. Catches: one line per survivor (as before)."""
    (tmp_path / "plan.yaml").write_text(make_plan("gpt-tiny", 4, ["dp4"] * 6, [6], 16, 2).to_yaml())
    environment = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}", OMP_NUM_THREADS="1",
                       PYTHONUNBUFFERED="1")
    launcher = subprocess.Popen([str(BIN / "torchrun"), "--standalone", "--nproc_per_node", "4", "-m", "gbmw", "train",
                                 JOB, "--plan", "plan.yaml", "--steps", "100000"], cwd=tmp_path, env=environment,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for line in launcher.stdout:
            if line.startswith("step ") and line.split()[1].startswith("2/"):
                break
        status, err = _kill_and_wait(launcher, _worker_ranks(launcher)[0], signal.SIGKILL)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    lines = [line for line in err.splitlines() if line.startswith("gbmw: error:")]
    assert status != 0 and len(lines) == 1 and "lost contact with another process during step" in lines[0], err[-3000:]


def test_under_the_deepspeed_launcher_one_survivor_reports_a_dead_rank_zero(tmp_path):
    """The deepspeed launcher's rendezvous store lives in rank 0: with rank 0 SIGKILLed the survivors cannot count
    reports there, and each printed its line (three of four). They now claim the report on their node — the first to
    bind the job's name in Linux's abstract socket namespace prints (adapters/runtime/launch.py). Catches: one line
    per survivor."""
    pytest.importorskip("deepspeed")
    from dist_fixture import free_port

    (tmp_path / "plan.yaml").write_text(make_plan("gpt-tiny", 4, ["dp4"] * 6, [6], 16, 2).to_yaml())
    environment = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}", OMP_NUM_THREADS="1",
                       PYTHONUNBUFFERED="1")
    launcher = subprocess.Popen([str(BIN / "deepspeed"), "--num_gpus", "4", "--master_port", str(free_port()),
                                 "--module", "gbmw", "train", JOB, "--plan", "plan.yaml", "--steps", "100000"],
                                cwd=tmp_path, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for line in launcher.stdout:
            if line.startswith("step ") and line.split()[1].startswith("2/"):
                break
        status, err = _kill_and_wait(launcher, _worker_ranks(launcher)[0], signal.SIGKILL)
        err += launcher.stdout.read()
    finally:
        if launcher.poll() is None:
            launcher.kill()
    lines = [line for line in err.splitlines() if line.startswith("gbmw: error:")]
    assert status != 0 and len(lines) == 1 and "lost contact with another process during step" in lines[0], err[-3000:]
