"""Issue 15, the checkpoint part of the bad-input corpus (tests/test_bad_inputs.py has the rest): a damaged or edited
checkpoint given to `gbmw train --load` ends in one line and exit status 2 before any step, and a save killed midway
is reported and removed by the next save or load."""

from __future__ import annotations

import os
import pickle
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
import yaml

torch = pytest.importorskip("torch")

from runtime_reference import make_plan  # noqa: E402
from test_bad_inputs import assert_one_line  # noqa: E402

from gbmw.adapters.runtime.partial_saves import MARKER, marker_text  # noqa: E402
from gbmw.cli.main import main  # noqa: E402

pytestmark = pytest.mark.torch

JOB = "gpt-tiny_cpu-x4"


class _RunsCode:
    def __reduce__(self):
        return (os.system, ("touch pwned",))


def _edit_manifest(change):
    def edit(folder):
        data = yaml.safe_load((folder / "checkpoint.yaml").read_text())
        change(data)
        (folder / "checkpoint.yaml").write_text(yaml.safe_dump(data))
    return edit


def _write_manifest(text: bytes):
    def edit(folder):
        (folder / "checkpoint.yaml").write_bytes(text)
    return edit


def _edit_layer(change):
    def edit(folder):
        file = folder / "layers" / "decoder.0.pt"
        tensors = torch.load(file, weights_only=True)
        change(tensors)
        file.unlink()
        torch.save(tensors, file)
    return edit


def _moment_of_wrong_shape(tensors):
    name = next(key for key in tensors if key.endswith("#exp_avg"))
    tensors[name] = torch.zeros(3, 5)


def _integer_weights(tensors):
    name = next(key for key in tensors if "#" not in key)
    tensors[name] = torch.zeros(tensors[name].shape, dtype=torch.int64)


def _pickle_that_runs_code(folder):
    (folder / "layers" / "decoder.0.pt").write_bytes(pickle.dumps({"w": _RunsCode()}))


CHECKPOINT_CASES = [
    ("no-step", _edit_manifest(lambda data: data.pop("step")), "field `step` is required"),
    ("negative-step", _edit_manifest(lambda data: data.update(step=-5)), "field `step`: value -5"),
    ("text-step", _edit_manifest(lambda data: data.update(step="ten")), "field `step`: value 'ten'"),
    ("format-2", _edit_manifest(lambda data: data.update(format=2)), "field `format`: value 2"),
    ("layer-path-traversal", _edit_manifest(lambda data: data["layers"].__setitem__(0, "../../etc/passwd")),
     "field `layers[0]`: value '../../etc/passwd' — not a layer name"),
    ("consumed-samples-2**62", _edit_manifest(lambda data: data.update(consumed_samples=2**62)),
     "field `consumed_samples`: value 4611686018427387904 after 1 steps"),
    ("consumed-samples-fewer-than-steps", _edit_manifest(lambda data: data.update(step=5, consumed_samples=3)),
     "field `consumed_samples`: value 3 after 5 steps"),
    ("betas", _edit_manifest(lambda data: data["adam"].update(betas=[0.9])), "field `adam.betas`"),
    ("unknown-field", _edit_manifest(lambda data: data.update(extra=1)), "unknown field `extra`"),
    ("not-utf8", _write_manifest(b"format: 1\nmodel: \xff\n"), "not UTF-8 text"),
    ("alias-bomb", _write_manifest(b'a: &a ["x","x","x","x","x","x","x","x","x"]\n' + b"".join(
        f"{n}: &{n} [{','.join(['*' + p] * 9)}]\n".encode() for p, n in zip("abcdefgh", "bcdefghi"))),
     "once its aliases are expanded"),
    ("list", _write_manifest(b"- 1\n"), "expected a mapping"),
    ("moment-shape", _edit_layer(_moment_of_wrong_shape), "has shape (3, 5), the model needs"),
    ("integer-weights", _edit_layer(_integer_weights), "not floating point"),
    ("extra-tensor", _edit_layer(lambda tensors: tensors.update(surprise=torch.zeros(3))),
     "tensor 'surprise' is no parameter (or Adam moment) of layer decoder.0"),
    ("unknown-moment", _edit_layer(lambda tensors: tensors.update({
        next(key for key in tensors if "#" not in key) + "#momentum": torch.zeros(3)})), "is no parameter (or Adam"),
    ("pickle-runs-code", _pickle_that_runs_code, "cannot be read"),
    ("missing-layer", lambda folder: (folder / "layers" / "decoder.0.pt").unlink(), "missing; the checkpoint is incomplete"),
]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    folder = tmp_path_factory.mktemp("saved")
    plan = make_plan("gpt-tiny", 1, ["single"] * 6, [6], 16, 2)
    (folder / "plan.yaml").write_text(plan.to_yaml())
    assert main(["train", JOB, "--plan", str(folder / "plan.yaml"), "--steps", "1", "--save",
                 str(folder / "checkpoint")]) == 0
    return folder


@pytest.mark.parametrize("name, damage, expected", CHECKPOINT_CASES, ids=[case[0] for case in CHECKPOINT_CASES])
def test_damaged_checkpoint_is_one_line(saved, tmp_path, capsys, monkeypatch, name, damage, expected):
    broken = tmp_path / "broken"
    shutil.copytree(saved / "checkpoint", broken)
    damage(broken)
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    status = main(["train", JOB, "--plan", str(saved / "plan.yaml"), "--steps", "1", "--load", str(broken)])
    captured = capsys.readouterr()
    assert_one_line(status, captured.err, expected)
    assert "step" not in captured.out.replace("gbmw train", "")  # stopped before any step
    assert not (tmp_path / "pwned").exists()


def test_load_of_a_file_is_one_line(saved, tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    status = main(["train", JOB, "--plan", str(saved / "plan.yaml"), "--load", str(tmp_path / "file")])
    assert_one_line(status, capsys.readouterr().err, "no checkpoint there")


def _leftover(folder: Path, marker: str | None) -> Path:
    (folder / "layers").mkdir(parents=True)
    (folder / "layers" / "embedding.pt").write_bytes(b"half")
    if marker is not None:
        (folder / MARKER).write_text(marker)
    return folder


def test_an_interrupted_save_is_reported_and_removed(saved, tmp_path, capsys):
    """A save killed midway leaves `.NAME.partial-*` marked by gbmw with its host and (dead) process; the next save
    into that name says so and removes it — and only it: a folder of the same pattern without gbmw's marker (a
    user's notes), one whose marker names another checkpoint, a live process or another host, stays, named in a
    note. Catches: removing by name alone (issue 31's lost folder), or leaving gbmw's own leftovers behind."""
    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True, check=True)
    dead_pid = int(finished.stdout)  # a process that has exited
    ours = _leftover(tmp_path / ".checkpoint.partial-x1y2", marker_text("checkpoint").replace(
        f"pid: {os.getpid()}", f"pid: {dead_pid}"))
    users = _leftover(tmp_path / ".checkpoint.partial-notes", None)
    other_name = _leftover(tmp_path / ".checkpoint.partial-other", marker_text("elsewhere").replace(
        f"pid: {os.getpid()}", f"pid: {dead_pid}"))
    running = _leftover(tmp_path / ".checkpoint.partial-live", marker_text("checkpoint"))  # this very process
    remote = _leftover(tmp_path / ".checkpoint.partial-remote", marker_text("checkpoint").replace(
        f"host: {socket.gethostname()}", "host: some-other-node"))
    status = main(["train", JOB, "--plan", str(saved / "plan.yaml"), "--steps", "1", "--save",
                   str(tmp_path / "checkpoint")])
    err = capsys.readouterr().err
    assert status == 0 and f"removed {ours}" in err and "interrupted save" in err
    assert not ours.exists() and (tmp_path / "checkpoint" / "checkpoint.yaml").is_file()
    assert not (tmp_path / "checkpoint" / MARKER).exists()  # a completed checkpoint carries no marker
    for kept, why in ((users, "no marker"), (other_name, "no marker"), (running, "still running"),
                      (remote, "some-other-node")):
        assert (kept / "layers" / "embedding.pt").read_bytes() == b"half", kept
        assert f"left {kept} in place" in err and why in err, (kept, err)


def test_a_failed_save_removes_its_partial_folder(saved, tmp_path, capsys, monkeypatch):
    """A save that fails while writing (here: the manifest cannot be written) leaves nothing behind."""
    from gbmw.adapters.runtime import checkpoint_files

    def fail(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint_files.yaml, "safe_dump", fail)
    status = main(["train", JOB, "--plan", str(saved / "plan.yaml"), "--steps", "1", "--save",
                   str(tmp_path / "checkpoint")])
    assert_one_line(status, capsys.readouterr().err, "cannot complete the checkpoint")
    assert list(tmp_path.iterdir()) == []


def test_loading_never_removes_a_users_folder_that_looks_like_an_interrupted_save(saved, tmp_path, capsys):
    """issue 31: `train --load ck` removed a user's `.ck.partial-*` folder of notes. It stays, named in a note, and
    the run loads and trains. Catches: the load path removing by name alone."""
    shutil.copytree(saved / "checkpoint", tmp_path / "ck")
    notes = tmp_path / ".ck.partial-my-notes"
    notes.mkdir()
    (notes / "todo.txt").write_text("mine")
    status = main(["train", JOB, "--plan", str(saved / "plan.yaml"), "--steps", "1", "--load", str(tmp_path / "ck")])
    err = capsys.readouterr().err
    assert status == 0 and (notes / "todo.txt").read_text() == "mine"
    assert f"left {notes} in place" in err and "no marker" in err


def test_a_non_finite_loss_stops_the_run_in_one_line_and_saves_nothing(saved, tmp_path, capsys):
    """issue 31: a checkpoint with NaN weights trained on with exit 0. The first step whose loss or gradient norm is
    not finite stops the run: status 2, one line naming the step, and the --save folder not written. Catches: a
    run that goes on (or saves) after a NaN step."""
    poisoned = tmp_path / "poisoned"
    shutil.copytree(saved / "checkpoint", poisoned)
    layer_file = poisoned / "layers" / "embedding.pt"
    tensors = torch.load(layer_file, weights_only=True)
    first = next(key for key in tensors if "#" not in key)
    tensors[first] = torch.full_like(tensors[first], float("nan"))
    torch.save(tensors, layer_file)
    status = main(["train", JOB, "--plan", str(saved / "plan.yaml"), "--steps", "3", "--load", str(poisoned),
                   "--save", str(tmp_path / "after")])
    captured = capsys.readouterr()
    assert_one_line(status, captured.err, "loss nan")
    assert "step 2: loss nan" in captured.err and "--save" in captured.err and "was not written" in captured.err
    assert not (tmp_path / "after").exists()
    assert "step     2" not in captured.out  # no step after the first NaN is reported as taken


_yaml_values = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=12),
                            lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner,
                                                                                       max_size=4), max_leaves=16)
_MANIFEST_FIELDS = ("format", "model", "step", "consumed_samples", "seed", "layers", "adam", "saved_under")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.dictionaries(st.sampled_from(_MANIFEST_FIELDS) | st.text(max_size=8), _yaml_values, max_size=9),
       keep_format=st.booleans())
def test_any_manifest_is_read_or_refused_in_one_checkpoint_error(tmp_path, data, keep_format):
    """issue 31: Hypothesis-generated manifests (any YAML mapping of the manifest's fields and others, any values):
    `read_manifest` returns the manifest or raises CheckpointError — never another exception."""
    from gbmw.adapters.runtime.checkpoint_files import read_manifest
    from gbmw.errors import CheckpointError
    if keep_format:
        data = {**data, "format": 1}
    folder = tmp_path / "ck"
    folder.mkdir(exist_ok=True)
    (folder / "checkpoint.yaml").write_text(yaml.safe_dump(data))
    try:
        manifest = read_manifest(folder)
    except CheckpointError as error:
        assert "\n" not in str(error)
    else:
        assert manifest["format"] == 1 and set(_MANIFEST_FIELDS) <= set(manifest)  # read only when complete


def test_a_save_every_folder_resumes_from_its_latest_complete_step(saved, tmp_path, capsys):
    """`--load DIR` of a `--save-every` folder takes the highest step folder holding a manifest; a user's folder of
    that name without one, or a leftover save of a later step without gbmw's marker, is never taken, and the
    unmarked leftover is left in place and named. Catches: resuming from an incomplete or foreign folder, or
    removing a user's folder by its name."""
    series = tmp_path / "ck"
    series.mkdir()
    shutil.copytree(saved / "checkpoint", series / "step-00000001")
    (series / "step-00000007").mkdir()  # a user's folder: no manifest
    users = _leftover(series / ".step-00000009.partial-notes", None)
    status = main(["train", JOB, "--plan", str(saved / "plan.yaml"), "--steps", "1", "--load", str(series)])
    captured = capsys.readouterr()
    assert status == 0, captured.err
    assert f"resumed from {series / 'step-00000001'} at step 1" in captured.out
    assert users.exists() and f"left {users} in place" in captured.err


def test_save_every_needs_save_and_an_empty_folder_has_no_checkpoint(saved, tmp_path, capsys):
    status = main(["train", JOB, "--plan", str(saved / "plan.yaml"), "--steps", "1", "--save-every", "2"])
    assert_one_line(status, capsys.readouterr().err, "--save-every 2: give --save DIR too")
    (tmp_path / "ck" / "step-00000003").mkdir(parents=True)  # killed before its first save completed
    status = main(["train", JOB, "--plan", str(saved / "plan.yaml"), "--steps", "1", "--load", str(tmp_path / "ck")])
    assert_one_line(status, capsys.readouterr().err, "no checkpoint there")
