"""`gbmw train --data`: Megatron's indexed datasets (written here by megatron-core's IndexedDatasetBuilder) and .npy
token arrays give the documented samples in the documented order whatever the plan; bad files are one error line
with status 2; and the target of issue 16 — a LLaMA-style model trained by `gbmw train` from an indexed dataset
under the planner's mixed per-layer plan on 4 gloo processes has the losses of single-process training on the
same data, and a checkpoint of it resumes on 1 process under another plan with the data it would have seen."""

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from runtime_reference import make_plan, reference_training  # noqa: E402

from gbmw.cli.main import main  # noqa: E402

pytestmark = pytest.mark.torch  # one process; the launcher test is marked dist

JOB = "llama-tiny_cpu-x4"
SEQ, VOCAB, GLOBAL_BATCH = 32, 128, 16  # llama-tiny's seq_length and vocab_size; the job's global batch
BIN = Path(sys.executable).parent


def documents(seed=5, count=24):
    generator = np.random.default_rng(seed)
    return [generator.integers(0, VOCAB, size=int(generator.integers(5, 90))) for _ in range(count)]


def write_indexed(prefix: Path, docs, dtype=np.uint16) -> str:
    """Megatron's .bin/.idx pair, by megatron-core's own builder (one sequence per document)."""
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=dtype)
    for doc in docs:
        builder.add_item(torch.from_numpy(doc.astype(np.int64)))
        builder.end_document()
    builder.finalize(f"{prefix}.idx")
    return str(prefix)


def expected_batch(stream: np.ndarray, consumed: int, count: int, seed: int = 0) -> np.ndarray:
    """The module docstring's rule, written out: sample k = stream[k·s : k·s + s + 1], epochs permuted by
    numpy.random.default_rng([seed, epoch])."""
    per_epoch = (len(stream) - 1) // SEQ
    rows = []
    for sample in range(consumed, consumed + count):
        epoch, position = divmod(sample, per_epoch)
        k = np.random.default_rng([seed, epoch]).permutation(per_epoch)[position]
        rows.append(stream[k * SEQ:k * SEQ + SEQ + 1])
    return np.stack(rows)


def test_both_formats_give_the_documented_samples_whatever_the_batching(tmp_path):
    from gbmw.adapters.runtime.token_data import TokenData

    docs = documents()
    stream = np.concatenate(docs)
    np.save(tmp_path / "tokens.npy", stream.astype(np.int32))
    for path in (write_indexed(tmp_path / "data", docs), write_indexed(tmp_path / "wide", docs, np.int32) + ".bin",
                 str(tmp_path / "tokens.npy")):
        data = TokenData(path, SEQ, VOCAB)
        assert data.tokens == len(stream) and data.samples_per_epoch == (len(stream) - 1) // SEQ
        whole = data.batch(0, 3 * GLOBAL_BATCH)  # crosses into the second epoch (31 samples per epoch here)
        rows = expected_batch(stream, 0, 3 * GLOBAL_BATCH)
        assert torch.equal(whole["inputs"], torch.from_numpy(rows[:, :-1])), path
        assert torch.equal(whole["tokens"], torch.from_numpy(rows[:, 1:])), path
        # a global batch is the same samples however it is consumed (another global batch, a resumed job)
        pieces = [data.batch(start, 8)["inputs"] for start in range(0, 3 * GLOBAL_BATCH, 8)]
        assert torch.equal(torch.cat(pieces), whole["inputs"])
        assert whole["inputs"].dtype == torch.int64


def _one_device_plan(folder: Path) -> str:
    path = folder / "plan-1.yaml"
    path.write_text(make_plan("llama-tiny", 1, ["single"] * 6, [6], GLOBAL_BATCH, 2).to_yaml())
    return str(path)


def _damaged(folder: Path, damage: str) -> str:
    prefix = write_indexed(folder / "data", documents())
    index, data = Path(prefix + ".idx"), Path(prefix + ".bin")
    if damage == "missing":
        return str(folder / "nothing")
    if damage == "header":
        index.write_bytes(b"NOTANIDX" + index.read_bytes()[8:])
    elif damage == "truncated index":
        index.write_bytes(index.read_bytes()[:-20])
    elif damage == "short data":
        data.write_bytes(data.read_bytes()[:-10])
    elif damage == "negative length":  # the first sequence's int32 length, right after the index's preamble
        from gbmw.adapters.runtime.token_data import INDEX_PREAMBLE_BYTES
        raw = bytearray(index.read_bytes())
        raw[INDEX_PREAMBLE_BYTES:INDEX_PREAMBLE_BYTES + 4] = (-5).to_bytes(4, "little", signed=True)
        index.write_bytes(bytes(raw))
    elif damage == "float array":
        np.save(folder / "floats.npy", np.ones(1000, dtype=np.float32))
        return str(folder / "floats.npy")
    elif damage == "random bytes":  # numpy would advise loading it unsafely (allow_pickle): never passed on
        (folder / "noise.npy").write_bytes(bytes(range(256)) * 4)
        return str(folder / "noise.npy")
    elif damage == "folder":
        (folder / "tokens.npy").mkdir()
        return str(folder / "tokens.npy")
    elif damage == "fifo":
        os.mkfifo(folder / "tokens.npy")
        return str(folder / "tokens.npy")
    elif damage == "uint64 ids":  # 2**63 + 5 must be reported as itself, not as the negative int64 it wraps to
        np.save(folder / "u64.npy", np.array([1, 2, 2**63 + 5] * 400, dtype=np.uint64))
        return str(folder / "u64.npy")
    elif damage == "not npy":
        (folder / "text.npy").write_text("hello")
        return str(folder / "text.npy")
    elif damage == "too short":
        np.save(folder / "short.npy", np.arange(SEQ, dtype=np.int64))
        return str(folder / "short.npy")
    elif damage == "vocabulary":  # tokenised for a larger vocabulary: id 300 ≥ 128 in the first batch
        np.save(folder / "wide.npy", np.array([1, 2, 300] * 400, dtype=np.int32))
        return str(folder / "wide.npy")
    return prefix


BAD_DATA = [
    ("missing", "no "),
    ("header", "not a Megatron index"),
    ("truncated index", "the index is corrupt or cut short"),
    ("short data", "the files do not belong together"),
    ("negative length", "sequence 0 has length -5"),
    ("float array", "holds float32 values, not integer token ids"),
    ("not npy", "not a .npy array (it does not start with NumPy's header)"),
    ("random bytes", "not a .npy array (it does not start with NumPy's header)"),
    ("folder", "is a folder, not a data file"),
    ("fifo", "is not a regular file (a pipe, device or socket)"),
    ("uint64 ids", "token id 9223372036854775813 in samples 0–15 is outside the model's vocabulary"),
    ("too short", "fewer than one sample of seq_length + 1 = 33 tokens"),
    ("vocabulary", "token id 300 in samples 0–15 is outside the model's vocabulary [0, 128)"),
]


@pytest.mark.parametrize("damage, message", BAD_DATA, ids=[damage for damage, _ in BAD_DATA])
def test_bad_data_is_one_clear_line(tmp_path, capsys, damage, message):
    data = _damaged(tmp_path, damage)
    status = main(["train", JOB, "--plan", _one_device_plan(tmp_path), "--data", data, "--steps", "1"])
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("gbmw")]
    assert status == 2
    assert len(err) == 1 and err[0].startswith(f"gbmw: error: --data {Path(data).parent}") and message in err[0], err


def test_data_trains_decoders_only(tmp_path, capsys):
    plan = tmp_path / "bert.yaml"
    plan.write_text(make_plan("bert-tiny", 1, ["single"] * 6, [6], 8, 1).to_yaml())
    job = tmp_path / "bert-job.yaml"
    job.write_text("model: bert-tiny\ncluster: cpu-x4\nprecision: fp32\nglobal_batch: 8\n")
    assert main(["train", str(job), "--plan", str(plan), "--data", str(tmp_path / "x.npy")]) == 2
    assert "--data trains decoder language models (`family: gpt`)" in capsys.readouterr().err


def _losses(out: str) -> list[float]:
    return [float(value) for value in re.findall(r"loss (\d+\.\d+)", out)]


def _gbmw(command: list[str], cwd: Path) -> str:
    environment = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}")
    done = subprocess.run(command, cwd=cwd, env=environment, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


@pytest.mark.dist
def test_train_a_llama_from_an_indexed_dataset_equals_single_process_training(tmp_path):
    docs = documents(count=30)
    stream = np.concatenate(docs)
    write_indexed(tmp_path / "corpus", docs)
    # the planner's mixed per-layer plan: under the job's 2.6 MiB it now runs ZeRO-1 in every layer (the runtime's
    # unfused passes priced), under 2.2 MiB it mixes strategies again
    _gbmw([str(BIN / "gbmw"), "plan", JOB, "--memory", "2.2MiB", "-o", "plan.yaml"], tmp_path)
    from gbmw.plan import Plan

    plan = Plan.load(tmp_path / "plan.yaml")
    assert len({strategy.name for strategy in plan.strategies}) > 1 and plan.num_devices == 4
    out = _gbmw([str(BIN / "torchrun"), "--standalone", "--nproc_per_node", "4", "-m", "gbmw", "train", JOB, "--plan",
                 "plan.yaml", "--data", "corpus", "--steps", "3", "--lr", "1e-3", "--save", "step3"], tmp_path)
    # resumed on 1 process under another plan, with another --seed: the data order stays the checkpoint's
    resumed = _gbmw([str(BIN / "gbmw"), "train", JOB, "--plan", _one_device_plan(tmp_path), "--data", "corpus.idx",
                     "--steps", "2", "--lr", "1e-3", "--load", "step3", "--seed", "7"], tmp_path)
    assert "from sample 48" in resumed and "the checkpoint's --seed 0 (not 7)" in resumed

    def batches(step):
        rows = torch.from_numpy(expected_batch(stream, step * GLOBAL_BATCH, GLOBAL_BATCH))
        return {"inputs": rows[:, :-1].contiguous(), "tokens": rows[:, 1:].contiguous()}

    # `gbmw train`'s defaults on both sides: Adam's ε = 1e-8, global-norm clipping at 1.0
    expected, _ = reference_training("llama-tiny", GLOBAL_BATCH, 5, max_grad_norm=1.0, batches=batches,
                                     learning_rate=1e-3, eps=1e-8)
    # Losses are printed to 6 decimals (±5e-7); fp32 reordering moves a mean of 512 token losses ≈ 4.85 by a few
    # ulps (4.8e-7 each): 5e-6 still catches a wrong sample (resuming one sample late moves the 4th loss by 4.6e-3
    # here, from the start of the data by 4e-2), a sample read twice or skipped, or a micro-batch's share lost. ε = 1e-8 makes an update's sign
    # follow rounding noise where a gradient is ~0, but such elements move the loss by ~lr·|gradient| ≈ 0.
    assert _losses(out) + _losses(resumed) == pytest.approx(expected, rel=0, abs=5e-6)


@pytest.mark.dist
def test_a_bad_token_found_mid_run_stops_every_rank_with_one_line(tmp_path):
    """The second global batch holds id 300 ≥ 128: every rank reads the same batch and finds it, rank 0 prints the
    one line, and every rank exits with status 2 (torchrun's summary lists each one)."""
    tokens = np.zeros(GLOBAL_BATCH * SEQ * 2 + 1, dtype=np.int32)
    per_epoch = (len(tokens) - 1) // SEQ
    second_batch = np.random.default_rng([0, 0]).permutation(per_epoch)[GLOBAL_BATCH:2 * GLOBAL_BATCH]
    tokens[second_batch[0] * SEQ + 5] = 300
    np.save(tmp_path / "tokens.npy", tokens)
    (tmp_path / "plan.yaml").write_text(make_plan("llama-tiny", 2, ["tp2", "dp2", "sdp2", "tp2", "dp2", "tp2"], [6],
                                                  GLOBAL_BATCH, 2).to_yaml())
    environment = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}", OMP_NUM_THREADS="1")
    done = subprocess.run([str(BIN / "torchrun"), "--standalone", "--nproc_per_node", "2", "-m", "gbmw", "train", JOB,
                           "--plan", "plan.yaml", "--data", "tokens.npy", "--steps", "3"], cwd=tmp_path,
                          env=environment, capture_output=True, text=True, timeout=240)
    output = done.stdout + done.stderr
    assert "step     1/3" in done.stdout and "step     2/3" not in done.stdout, output[-3000:]
    errors = [line for line in output.splitlines() if "gbmw: error:" in line]
    assert errors == ["gbmw: error: --data tokens.npy: token id 300 in samples 16–31 is outside the model's vocabulary "
                      "[0, 128): the data was tokenised for another model"], output[-3000:]
    assert output.count("exitcode  : 2") == 2, output[-3000:]


def test_a_bad_indexed_dataset_is_one_line_on_stderr_from_the_command_line(tmp_path):
    """issue 31: megatron-core's import-time UserWarnings (Transformer Engine and Apex not installed) came before
    every --data error on an indexed dataset. From the installed command, stderr is the one error line. Catches: any
    library's import noise before the line (pytest's own tests cannot see warnings: they capture them)."""
    data = _damaged(tmp_path, "header")
    done = subprocess.run([str(BIN / "gbmw"), "train", JOB, "--plan", _one_device_plan(tmp_path), "--data", data,
                           "--steps", "1"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [f"gbmw: error: --data {data}.idx: not a Megatron index (its first bytes are not "
                                        "b'MMIDIDX\\x00\\x00')"], done.stderr


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tail=st.binary(max_size=200), header=st.booleans(), data=st.binary(max_size=64),
       dtype_code=st.integers(0, 12), counts=st.tuples(st.integers(0, 2**40), st.integers(0, 2**40)))
def test_any_index_file_is_read_or_refused_in_one_data_error(tmp_path, tail, header, data, dtype_code, counts):
    """issue 31: Hypothesis-generated .idx files (Megatron's header or not, any dtype code and counts, any bytes
    after) beside any .bin: TokenData opens them or raises DataError in one line — never another exception."""
    import struct

    from gbmw.adapters.runtime.token_data import INDEX_HEADER, TokenData
    from gbmw.errors import DataError
    folder = tmp_path / "idx"
    folder.mkdir(exist_ok=True)
    preamble = INDEX_HEADER + struct.pack("<QBQQ", 1, dtype_code, *counts) if header else b""
    (folder / "d.idx").write_bytes(preamble + tail)
    (folder / "d.bin").write_bytes(data)
    try:
        TokenData(str(folder / "d"), 8, 128)
    except DataError as error:
        assert "\n" not in str(error)
