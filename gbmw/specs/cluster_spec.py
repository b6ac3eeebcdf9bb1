"""What the planner knows of a cluster: nodes × devices per node, the device (memory, FLOP/s per precision),
and the bandwidth and latency of each level of the interconnect, every number citing its source.

Loaded from YAML with `yaml.safe_load`; memory sizes may be written with units ("80GiB", "1.5 GB").
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import ByteSize, Field, model_validator

from gbmw.errors import SpecError
from gbmw.specs.files import read_yaml
from gbmw.specs.model_spec import HIGHER_PRECISION, PRECISIONS
from gbmw.specs.schema import MAX_DEVICES, MAX_MEMORY_BYTES, Frozen, Items, MemorySize, validate_as


class FlopsPerPrecision(Frozen):
    """Dense FLOP/s of one device per precision, in TFLOP/s (1e12); absent = not supported."""

    fp32: float = Field(gt=0, le=1e9)
    tf32: float | None = Field(default=None, gt=0, le=1e9)
    fp16: float | None = Field(default=None, gt=0, le=1e9)
    bf16: float | None = Field(default=None, gt=0, le=1e9)
    fp8: float | None = Field(default=None, gt=0, le=1e9)
    """FP8 (E4M3/E5M2) tensor-core GEMMs, as Transformer Engine's linear layers run them; absent: no FP8 tensor
    cores (A100), and precision fp8 is refused."""


class AttentionFlops(Frozen):
    """Measured fused-attention TFLOP/s per precision; a precision left out runs attention at the matmul rate."""

    fp32: float | None = Field(default=None, gt=0, le=1e9)
    tf32: float | None = Field(default=None, gt=0, le=1e9)
    fp16: float | None = Field(default=None, gt=0, le=1e9)
    bf16: float | None = Field(default=None, gt=0, le=1e9)


class DeviceSpec(Frozen):
    name: str
    memory: MemorySize
    """Device memory, e.g. `80GiB`."""
    peak_tflops: FlopsPerPrecision
    """Datasheet dense peak per precision."""
    sustained_tflops: FlopsPerPrecision
    """Measured dense matmul rate per precision (large GEMMs, cuBLAS or torch.matmul): a kernel rate, never
    an end-to-end training rate, which already contains the communication and bubbles the estimator adds."""
    attention_tflops: AttentionFlops | None = None
    """Measured forward + backward rate of fused (flash) attention kernels per precision; absent: they run at
    `sustained_tflops` (the recipe says which)."""
    multiprocessors: int | None = Field(default=None, ge=1, le=2**16)
    """Streaming multiprocessors (datasheet): a matmul runs its output tiles in waves of one per multiprocessor
    (gbmw.cost.matmul_waves); None: every matmul at `sustained_tflops`, whatever its shape (CPUs)."""
    memory_bandwidth_gb_per_s: float = Field(gt=0, le=1e9)
    """Measured device-memory bandwidth of memory-bound kernels (a STREAM copy), in GB/s (1e9 bytes/s): the
    rate of norms, activations, dropout, residual adds and the optimizer step."""

    @model_validator(mode="after")
    def _sustained_below_peak(self) -> "DeviceSpec":
        for precision in ("fp32", "tf32", "fp16", "bf16", "fp8"):
            peak, sustained = getattr(self.peak_tflops, precision), getattr(self.sustained_tflops, precision)
            if sustained is not None and peak is None:
                raise ValueError(f"sustained_tflops.{precision} is given but peak_tflops.{precision} is not")
            if sustained is not None and sustained > peak:
                raise ValueError(
                    f"sustained_tflops.{precision} ({sustained}) exceeds peak_tflops.{precision} ({peak}); "
                    "sustained must be at most the peak"
                )
        return self


class LinkLevel(Frozen):
    """One level of the interconnect hierarchy (innermost first): islands of `devices` devices."""

    name: str
    """`intra_node`, `inter_node`, or a finer level such as `pcie_switch`."""
    devices: int = Field(ge=1, le=MAX_DEVICES)
    """Devices in one island at this level; the outermost level's island is the whole cluster."""
    bandwidth_gb_per_s: float = Field(gt=0, le=1e9)
    """Achieved all-reduce bus bandwidth (nccl-tests convention) of a collective spanning one whole
    island of this level with all its devices taking part, in GB/s (1e9 bytes/s)."""
    latency_us: float = Field(default=0.0, ge=0, le=1e9)
    """Per-step latency of a collective at this level, in microseconds."""


class ClusterSpec(Frozen):
    """Nodes × devices per node, the device, and the bandwidth of each link level."""

    name: str
    nodes: int = Field(ge=1, le=MAX_DEVICES)
    devices_per_node: int = Field(ge=1, le=1024)
    device: DeviceSpec
    links: Items[LinkLevel] = Field(min_length=1, max_length=8)
    reserved_memory: Annotated[ByteSize, Field(ge=0, le=MAX_MEMORY_BYTES)] = ByteSize(0)
    """Device memory the model cannot use (CUDA context, communication buffers, fragmentation)."""
    overlap_slowdown: float = Field(default=1.3, ge=1.0, le=10.0)
    """Slowdown of both compute and communication while they overlap (paper Sec. 5: 1.3)."""
    provenance: Literal["datasheet", "calibrated", "profiled"] = "datasheet"
    sources: Items[str] = Field(default=(), max_length=100)

    @model_validator(mode="after")
    def _links_nest(self) -> "ClusterSpec":
        previous = 1
        for index, level in enumerate(self.links):
            if level.devices % previous != 0 or level.devices < previous:
                raise ValueError(
                    f"links[{index}].devices ({level.devices}) must be a multiple of the previous level's "
                    f"({previous}): levels go from the innermost island outwards"
                )
            previous = level.devices
        if self.num_devices > MAX_DEVICES:
            raise ValueError(f"nodes({self.nodes}) * devices_per_node({self.devices_per_node}) = {self.num_devices} "
                             f"devices; gbmw plans for at most {MAX_DEVICES}")
        if self.usable_memory_bytes <= 0:
            raise ValueError(f"reserved_memory ({int(self.reserved_memory)} bytes) leaves no usable memory of the "
                             f"device's {int(self.device.memory)} bytes")
        if previous != self.num_devices:
            raise ValueError(
                f"the outermost link level spans {previous} devices but the cluster has "
                f"nodes({self.nodes}) * devices_per_node({self.devices_per_node}) = {self.num_devices}"
            )
        return self

    @property
    def num_devices(self) -> int:
        return self.nodes * self.devices_per_node

    @property
    def usable_memory_bytes(self) -> int:
        return int(self.device.memory) - int(self.reserved_memory)

    def sustained_flops(self, precision: str) -> float:
        """Sustained FLOP/s of one device's matmuls for a training precision (fp32 means true fp32; tf32, fp32 training
        with TF32 matmuls); under fp8, of the matmuls outside the FP8 linear layers (bf16: the LM head, the router):
        `linear_flops` gives theirs."""
        tflops = self._tflops(self.device.sustained_tflops, HIGHER_PRECISION.get(precision, precision))
        return tflops * 1e12

    def linear_flops(self, precision: str) -> float:
        """Sustained FLOP/s of the linear layers' GEMMs: the measured FP8 GEMM rate under fp8 (Transformer Engine),
        the matmul rate of the precision otherwise."""
        if precision != "fp8":
            return self.sustained_flops(precision)
        return self._tflops(self.device.sustained_tflops, "fp8") * 1e12

    def attention_flops(self, precision: str) -> float:
        """FLOP/s of fused attention kernels: the measured attention rate, or the matmul rate where none is given
        (under fp8, bf16's: Transformer Engine's FP8 recipes leave the attention core in bf16)."""
        precision = HIGHER_PRECISION.get(precision, precision)
        table = self.device.attention_tflops
        rate = getattr(table, precision, None) if table is not None else None
        return rate * 1e12 if rate is not None else self.sustained_flops(precision)

    @property
    def memory_bandwidth_bytes_per_s(self) -> float:
        return self.device.memory_bandwidth_gb_per_s * 1e9

    def peak_flops(self, precision: str) -> float:
        return self._tflops(self.device.peak_tflops, precision) * 1e12

    def _tflops(self, table: FlopsPerPrecision, precision: str) -> float:
        value = getattr(table, precision, None)
        if value is None and precision == "fp8":
            supported = [p for p in PRECISIONS if getattr(table, p, None) is not None]
            raise SpecError(
                f"cluster {self.name}: precision fp8: device {self.device.name} has no FP8 rate (device.peak_tflops.fp8 "
                f"and sustained_tflops.fp8 are not given: no FP8 tensor cores, e.g. A100); train in one of {supported}, "
                "or give the device's FP8 GEMM rates"
            )
        if value is None and precision == "tf32":
            raise SpecError(
                f"cluster {self.name}: precision tf32: device {self.device.name} has no TF32 rate (device.peak_tflops"
                ".tf32 and sustained_tflops.tf32 are not given: TF32 tensor cores came with Ampere, e.g. not on a TITAN "
                "RTX); train in fp32, or give the device's TF32 matmul rates")
        if value is None:
            supported = [p for p in PRECISIONS if getattr(table, p, None) is not None]
            raise SpecError(
                f"cluster {self.name}: device {self.device.name} has no {precision} FLOP/s; "
                f"supported precisions: {supported}"
            )
        return value


def load_cluster(path: str | Path) -> ClusterSpec:
    """Load a ClusterSpec from a YAML file."""
    return validate_as(ClusterSpec, read_yaml(path), str(path))
