"""`gbmw train`: one process, torchrun and the deepspeed launcher on a mixed plan from `gbmw plan`; clear errors
for a plan of another world size, missing, corrupt or existing checkpoints; a dead rank stops the others."""

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from dist_fixture import free_port  # noqa: E402
from runtime_reference import make_plan  # noqa: E402

from gbmw.cli.main import main  # noqa: E402

pytestmark = pytest.mark.torch  # in one process; the launcher tests are marked dist

JOB = "gpt-tiny_cpu-x4"
BIN = Path(sys.executable).parent


def write_plan(folder: Path, processes: int, strategies: list[str], partition=(6,), micro_batches=2) -> str:
    plan = make_plan("gpt-tiny", processes, strategies, list(partition), 16, micro_batches)
    path = folder / f"plan-{processes}.yaml"
    path.write_text(plan.to_yaml())
    return str(path)


def run_cli(capsys, *argv):
    status = main(list(argv))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


@pytest.fixture(scope="module")
def one_device_checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("train")
    plan = write_plan(folder, 1, ["single"] * 6)
    assert main(["train", JOB, "--plan", plan, "--steps", "2", "--save", str(folder / "checkpoint")]) == 0
    return folder, plan


def test_one_process_trains_saves_and_resumes(one_device_checkpoint, capsys):
    folder, plan = one_device_checkpoint
    status, out, err = run_cli(capsys, "train", JOB, "--plan", plan, "--steps", "1", "--load",
                               str(folder / "checkpoint"))
    assert status == 0, err
    assert "resumed from" in out and "step     3/3" in out and "samples/s" in out


def test_plan_for_another_world_size(tmp_path, capsys):
    plan = write_plan(tmp_path, 2, ["dp2"] * 6)
    status, _, err = run_cli(capsys, "train", JOB, "--plan", plan)
    assert status == 2
    assert "num_devices=2 but 1 process(es) were launched" in err and "torchrun --standalone --nproc_per_node 2" in err
    assert "Traceback" not in err


def test_missing_checkpoint(one_device_checkpoint, tmp_path, capsys):
    _, plan = one_device_checkpoint
    status, _, err = run_cli(capsys, "train", JOB, "--plan", plan, "--load", str(tmp_path / "nothing"))
    assert status == 2 and "no checkpoint there" in err and "checkpoint.yaml" in err


@pytest.mark.parametrize("damage", ["truncated layer", "garbage manifest", "missing layer", "other model"])
def test_corrupt_checkpoint(one_device_checkpoint, tmp_path, capsys, damage):
    folder, plan = one_device_checkpoint
    broken = tmp_path / "broken"
    shutil.copytree(folder / "checkpoint", broken)
    if damage == "truncated layer":
        layer = broken / "layers" / "decoder.1.pt"
        layer.write_bytes(layer.read_bytes()[:300])
        expected = "decoder.1.pt: cannot be read"
    elif damage == "garbage manifest":
        (broken / "checkpoint.yaml").write_text("format: [unclosed\n")
        expected = "not valid YAML"
    elif damage == "missing layer":
        (broken / "layers" / "head.pt").unlink()
        expected = "head.pt: missing"
    else:
        manifest = (broken / "checkpoint.yaml").read_text().replace("model: gpt-tiny", "model: bert-tiny")
        (broken / "checkpoint.yaml").write_text(manifest)
        expected = "field `model`: value 'bert-tiny'"
    status, _, err = run_cli(capsys, "train", JOB, "--plan", plan, "--load", str(broken))
    assert status == 2 and expected in err, err
    assert "Traceback" not in err


def test_save_never_replaces(one_device_checkpoint, capsys):
    folder, plan = one_device_checkpoint
    before = sorted(path.name for path in (folder / "checkpoint" / "layers").iterdir())
    status, _, err = run_cli(capsys, "train", JOB, "--plan", plan, "--save", str(folder / "checkpoint"))
    assert status == 2 and "exists; gbmw does not overwrite" in err
    assert sorted(path.name for path in (folder / "checkpoint" / "layers").iterdir()) == before


def _launch(command: list[str], cwd: Path, timeout_s: float = 240) -> str:
    environment = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}")
    done = subprocess.run(command, cwd=cwd, env=environment, capture_output=True, text=True, timeout=timeout_s)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    """The README's flow: `gbmw plan` on the tiny job; the plan mixes strategies across layers."""
    folder = tmp_path_factory.mktemp("launch")
    _launch([str(BIN / "gbmw"), "plan", JOB, "-o", "plan.yaml"], folder)
    from gbmw.plan import Plan

    plan = Plan.load(folder / "plan.yaml")
    assert len(set(plan.strategies)) > 1, [strategy.name for strategy in plan.strategies]
    return folder


@pytest.mark.dist
def test_torchrun(planned):
    out = _launch([str(BIN / "torchrun"), "--standalone", "--nproc_per_node", "4", "-m", "gbmw", "train", JOB,
                   "--plan", "plan.yaml", "--steps", "2"], planned)
    assert "step     2/2" in out


@pytest.mark.dist
def test_deepspeed_launcher(planned):
    pytest.importorskip("deepspeed")
    out = _launch([str(BIN / "deepspeed"), "--num_gpus", "4", "--master_port", str(free_port()), "--module", "gbmw",
                   "train", JOB, "--plan", "plan.yaml", "--steps", "2"], planned)
    assert "step     2/2" in out


@pytest.mark.dist
def test_dead_rank_stops_the_others(tmp_path):
    """Kill one of two ranks mid-training: the survivor stops with one message, well before its timeout."""
    plan = write_plan(tmp_path, 2, ["dp2"] * 6)
    port = free_port()
    processes = []
    for rank in range(2):
        environment = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                           MASTER_PORT=str(port), OMP_NUM_THREADS="1")
        processes.append(subprocess.Popen(
            [sys.executable, "-m", "gbmw", "train", JOB, "--plan", plan, "--steps", "100000", "--timeout", "600"],
            env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    survivor, victim = processes
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # rank 0 prints a line per step
        line = survivor.stdout.readline()
        if line.startswith("step") and line.split()[1].startswith("3/"):
            break
    else:
        pytest.fail("training did not reach step 3")
    victim.send_signal(signal.SIGKILL)
    try:  # its collective timeout is 600 s: stopping within 90 s means it noticed the dead peer, not the timeout
        _, err = survivor.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        survivor.kill()
        pytest.fail("the surviving rank hung after its peer died")
    assert survivor.returncode != 0
    assert "lost contact with another process" in err, err[-2000:]


def test_a_checkpoint_gets_the_users_usual_permissions(one_device_checkpoint):
    """The checkpoint is written to a private temporary folder and renamed into place; it must end with the mode
    mkdir() gives under the user's umask, not mkdtemp's 0700, which hides it from the job's group."""
    import stat

    from gbmw.specs.files import permissions_as_created

    folder, _ = one_device_checkpoint
    assert stat.S_IMODE((folder / "checkpoint").stat().st_mode) == permissions_as_created(0o777)
