"""Training samples from a tokenised dataset on disk, the same under every plan (`gbmw train --data PATH`).

Two formats:
* Megatron's indexed dataset, `PATH.bin` + `PATH.idx` (what Megatron-LM's `tools/preprocess_data.py` writes; PATH
  may also name either file), read with megatron-core's own reader (`megatron.core.datasets.indexed_dataset
  .IndexedDataset`, memory-mapped);
* a plain tokenised array, `PATH.npy` of integer token ids (read memory-mapped by numpy; any shape, read in C
  order as one stream).

The dataset is one stream of tokens (an indexed dataset's sequences in file order, documents as the tokenizer
ended them). Sample k is the s + 1 tokens starting at token k·s (s = the model's seq_length): inputs are its
first s tokens, labels its last s, and consecutive samples share one token, as Megatron's GPTDataset cuts them.
With n = ⌊(tokens − 1) / s⌋ samples per epoch, the global sample index g (samples consumed by the whole job
before it) is sample permutation_e[g mod n] of epoch e = ⌊g / n⌋, where permutation_e =
`numpy.random.default_rng([seed, e]).permutation(n)`. A global batch is the `global_batch` samples from
`consumed_samples` on: nothing depends on the data-parallel or pipeline layout or on micro-batching, so a job
resumed under another plan (the checkpoint records `consumed_samples` and the seed) reads the data it would have
read.

Every problem with the files is one `DataError` line (gbmw.cli.main exits with status 2): a missing file, an index
that is not Megatron's or does not match its .bin, a dtype that is not integer, too few tokens for one sample,
and — checked on every batch read — a token id outside [0, vocab_size).
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

from gbmw.errors import DataError

INDEX_HEADER = b"MMIDIDX\x00\x00"
"""The first 9 bytes of a Megatron .idx file (then version 1 as <Q, the dtype code as <B, two <Q counts)."""
INDEX_PREAMBLE_BYTES = 9 + 8 + 1 + 8 + 8


class TokenData:
    """Samples of `seq_length + 1` tokens of one tokenised dataset (see the module docstring)."""

    def __init__(self, path: str | Path, seq_length: int, vocab_size: int, seed: int = 0):
        self.path, self.seq_length, self.vocab_size, self.seed = str(path), seq_length, vocab_size, seed
        if self.path.endswith(".npy"):
            self._pieces = _npy_stream(self.path)
        else:
            self._pieces = _indexed_stream(self.path)
        self.dtype = self._pieces.dtype
        if not np.issubdtype(self.dtype, np.integer):
            raise DataError(f"--data {self.path}: holds {self.dtype} values, not integer token ids")
        self.tokens = self._pieces.tokens
        self.samples_per_epoch = (self.tokens - 1) // seq_length
        if self.samples_per_epoch < 1:
            raise DataError(f"--data {self.path}: {self.tokens} tokens, fewer than one sample of seq_length + 1 = "
                            f"{seq_length + 1} tokens")
        self._permutations: dict[int, np.ndarray] = {}

    def with_seed(self, seed: int) -> "TokenData":
        """The same files with another sample order (a resumed job keeps the order its checkpoint was trained on)."""
        copy = object.__new__(TokenData)
        copy.__dict__.update(self.__dict__, seed=seed, _permutations={})
        return copy

    def sample_index(self, global_sample: int) -> int:
        """Which sample of the epoch the job's `global_sample`-th sample is (the module docstring's rule)."""
        epoch, position = divmod(global_sample, self.samples_per_epoch)
        if epoch not in self._permutations:
            self._permutations = {epoch: np.random.default_rng([self.seed, epoch]).permutation(self.samples_per_epoch)}
        return int(self._permutations[epoch][position])

    def sample(self, global_sample: int) -> np.ndarray:
        """The s + 1 token ids (int64) of the job's `global_sample`-th sample."""
        return self._raw_sample(global_sample).astype(np.int64)

    def _raw_sample(self, global_sample: int) -> np.ndarray:
        start = self.sample_index(global_sample) * self.seq_length
        return self._pieces.read(start, self.seq_length + 1)

    def batch(self, consumed_samples: int, global_batch: int):
        """{"inputs", "tokens"}: int64 tensors [global_batch, seq_length] of the samples consumed_samples … + global_batch
        − 1 (labels are the inputs shifted by one token); a token id outside the vocabulary is a DataError."""
        import torch

        # checked in the file's own dtype: a uint64 id above 2**63 - 1 is that id, not a negative int64
        rows = np.stack([self._raw_sample(consumed_samples + offset) for offset in range(global_batch)])
        low, high = int(rows.min()), int(rows.max())
        if low < 0 or high >= self.vocab_size:
            bad = low if low < 0 else high
            raise DataError(f"--data {self.path}: token id {bad} in samples {consumed_samples}–"
                            f"{consumed_samples + global_batch - 1} is outside the model's vocabulary "
                            f"[0, {self.vocab_size}): the data was tokenised for another model")
        sequence = torch.from_numpy(rows.astype(np.int64))
        return {"inputs": sequence[:, :-1].contiguous(), "tokens": sequence[:, 1:].contiguous()}


class _Stream:
    """A flat token stream over pieces (the sequences of an indexed dataset, or one array)."""

    def __init__(self, dtype, lengths: np.ndarray, read_piece):
        self.dtype = np.dtype(dtype)
        self.starts = np.concatenate(([0], np.cumsum(lengths, dtype=np.int64)))
        self.tokens = int(self.starts[-1])
        self._read_piece = read_piece

    def read(self, start: int, count: int) -> np.ndarray:
        parts, position, end = [], start, start + count
        piece = int(np.searchsorted(self.starts, start, side="right")) - 1
        while position < end:
            offset = position - int(self.starts[piece])
            length = min(end, int(self.starts[piece + 1])) - position
            if length > 0:
                parts.append(np.asarray(self._read_piece(piece, offset, length)))
            position += max(length, 0)
            piece += 1
        return np.concatenate(parts)


def _not_a_file(path: Path) -> str | None:
    """Why `path` cannot be read as a data file, or None for a regular file."""
    if path.is_file():
        return None
    if path.is_dir():
        return "is a folder, not a data file"
    return "is not a regular file (a pipe, device or socket)" if path.exists() else "no such file"


def _npy_stream(path: str) -> _Stream:
    problem = _not_a_file(Path(path))
    if problem:
        raise DataError(f"--data {path}: {problem}")
    with open(path, "rb") as stream:
        if stream.read(6) != b"\x93NUMPY":
            raise DataError(f"--data {path}: not a .npy array (it does not start with NumPy's header); give token ids "
                            "saved by numpy.save, or a Megatron indexed dataset")
    try:
        array = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError) as error:
        if "allow_pickle" in str(error):  # never pass numpy's advice to load it unsafely on
            raise DataError(f"--data {path}: holds Python objects, which gbmw never unpickles; give an array of "
                            "integer token ids") from None
        raise DataError(f"--data {path}: not a readable .npy array ({_first_line(error)})") from None
    flat = array.reshape(-1) if array.flags.c_contiguous else np.ascontiguousarray(array).reshape(-1)
    return _Stream(array.dtype, np.array([flat.size], dtype=np.int64),
                   lambda piece, offset, length: flat[offset:offset + length])


def _indexed_stream(path: str) -> _Stream:
    prefix = path[:-4] if path.endswith((".bin", ".idx")) else path
    index_path, data_path = Path(prefix + ".idx"), Path(prefix + ".bin")
    for file in (index_path, data_path):
        problem = _not_a_file(file)
        if problem and problem != "no such file":
            raise DataError(f"--data {path}: {file} {problem}")
    missing = [str(file) for file in (index_path, data_path) if not file.is_file()]
    if missing:
        raise DataError(f"--data {path}: no {' and no '.join(missing)} (a Megatron indexed dataset is PREFIX.bin + "
                        "PREFIX.idx; a token array is a .npy file)")
    dtype, sequences, documents = _check_index(index_path)
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    try:
        dataset = IndexedDataset(prefix, mmap=True)
    except (AssertionError, ValueError, struct.error, OSError) as error:
        raise DataError(f"--data {index_path}: megatron-core cannot read it ({_first_line(error)}): the index is "
                        "corrupt") from None
    lengths = np.asarray(dataset.index.sequence_lengths, dtype=np.int64)
    pointers = np.asarray(dataset.index.sequence_pointers, dtype=np.int64)
    negative = np.flatnonzero(lengths < 0)
    if negative.size:
        raise DataError(f"--data {index_path}: sequence {int(negative[0])} has length {int(lengths[negative[0]])} "
                        f"({negative.size} negative in all): the index is corrupt; rebuild it from the token files")
    item_bytes = np.dtype(dtype).itemsize
    expected_bytes = int(lengths.sum()) * item_bytes
    if data_path.stat().st_size != expected_bytes or (len(lengths) and (
            pointers[0] != 0 or np.any(pointers[1:] != pointers[:-1] + lengths[:-1] * item_bytes))):
        raise DataError(f"--data {path}: {index_path.name} describes {expected_bytes} bytes of {np.dtype(dtype)} "
                        f"tokens but {data_path.name} holds {data_path.stat().st_size}: the files do not belong "
                        "together (or one was cut short)")
    return _Stream(dtype, lengths, lambda piece, offset, length: dataset.get(piece, offset, length))


def _check_index(index_path: Path) -> tuple[np.dtype, int, int]:
    """The token dtype and the sequence and document counts of a .idx file, after checking its header and size
    (megatron-core's reader asserts the header but trusts the counts)."""
    from megatron.core.datasets.indexed_dataset import DType

    with index_path.open("rb") as stream:
        data = stream.read(INDEX_PREAMBLE_BYTES)
    if len(data) < INDEX_PREAMBLE_BYTES or data[:9] != INDEX_HEADER:
        raise DataError(f"--data {index_path}: not a Megatron index (its first bytes are not {INDEX_HEADER!r})")
    version, code, sequences, documents = struct.unpack("<QBQQ", data[9:])
    if version != 1:
        raise DataError(f"--data {index_path}: index version {version}; megatron-core reads version 1")
    try:
        dtype = np.dtype(DType.dtype_from_code(code))
    except (KeyError, ValueError):
        raise DataError(f"--data {index_path}: unknown token dtype code {code}") from None
    expected = INDEX_PREAMBLE_BYTES + sequences * (4 + 8) + documents * 8
    size = index_path.stat().st_size
    if size != expected:
        raise DataError(f"--data {index_path}: {size} bytes, but its header's {sequences} sequences and {documents} "
                        f"document boundaries need {expected}: the index is corrupt or cut short")
    return dtype, sequences, documents


def _first_line(error: BaseException) -> str:
    lines = str(error).splitlines()
    return lines[0][:120] if lines else type(error).__name__
