"""What the planner is given: a model (ModelSpec of LayerSpecs), a cluster (ClusterSpec) and a job (JobSpec).

All three are frozen pydantic models loaded from YAML with `yaml.safe_load`. A malformed file gets
one `SpecError` that names the file, each offending field, its value and what is allowed — never a
traceback from deep inside. Units are in the field names (`_bytes`, `_flops`, `_s`, `_gb_per_s`);
memory sizes in YAML may be written with units ("80GiB", "1.5 GB").

Terms follow the paper (Sec. 3.1): a layer's *boundary* activation is its input tensor, its
*intermediate* activations are what its backward pass needs from inside it; model states are
parameters, gradients and optimizer states.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Literal

import numpy as np
import yaml
from pydantic import BaseModel, ByteSize, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from gbmw.errors import SpecError

Precision = Literal["fp32", "fp16", "bf16"]
PRECISIONS: tuple[str, ...] = ("fp32", "fp16", "bf16")

#: Bytes of one activation element under each training precision (16-bit activations in mixed precision).
ACTIVATION_DTYPE_BYTES: dict[str, int] = {"fp32": 4, "fp16": 2, "bf16": 2}


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


# ----------------------------------------------------------------------------------------------
# Model
# ----------------------------------------------------------------------------------------------


class LayerSpec(_Frozen):
    """One layer of the model as the planner sees it (an embedding, a Transformer block, a head)."""

    name: str
    """Unique name, e.g. `decoder.17`; used in plans, tables and the runtime's parameter names."""
    kind: str
    """What the layer is: `embedding`, `encoder`, `decoder`, `cross_decoder`, `patch_merging`, `head`…"""
    parameter_count: int = Field(ge=0)
    """All parameters of the layer (a tied copy included: see `tied_to`)."""
    tp_split_parameter_count: int = Field(ge=0)
    """The part of `parameter_count` that tensor parallelism divides (weights of column/row-parallel
    linears, vocabulary-parallel embeddings); the rest (norms, some biases) is replicated."""
    forward_flops_per_sample: float = Field(ge=0)
    """Floating-point operations of one forward pass for one sample."""
    boundary_activation_bytes_per_sample: float = Field(ge=0)
    """The layer's input, stashed for backward and sent between pipeline stages (Sec. 3.1 `bnd`).
    Replicated across the ranks of a TP group."""
    intermediate_activation_bytes_per_sample: float = Field(ge=0)
    """Activations stashed inside the layer that TP does not divide (norm inputs, dropout masks of
    the residual stream)."""
    intermediate_tp_split_activation_bytes_per_sample: float = Field(ge=0)
    """Activations stashed inside the layer that TP divides (attention scores, MLP hidden)."""
    side_input_bytes_per_sample: float = Field(default=0.0, ge=0)
    """A second input carried alongside the boundary, e.g. the encoder output every T5 decoder layer
    reads. Stashed once per pipeline stage and sent between stages with the boundary."""
    tp_allreduce_bytes_per_sample: float = Field(default=0.0, ge=0)
    """Bytes all-reduced within the TP group per sample in the forward pass (the backward pass
    all-reduces as many); 0 for layers TP cannot split."""
    attention_heads: int = Field(default=0, ge=0)
    """Query heads of the layer's attention (0: no attention); TP must divide it."""
    kv_heads: int = Field(default=0, ge=0)
    """Key/value heads (grouped-query attention; 0: as many as attention_heads); TP must divide it."""
    tied_to: str | None = None
    """Name of a layer whose parameters this one shares (an output head tied to the embedding)."""
    tied_parameter_count: int = Field(default=0, ge=0)
    """The part of `parameter_count` shared with `tied_to` (TP divides it): not counted again in the
    model's parameter total, nor in a stage that holds both layers."""
    forward_time_per_sample_s: float | None = Field(default=None, ge=0)
    """Measured forward time per sample on one device (from `gbmw profile`); when absent, time is
    `forward_flops_per_sample` over the device's sustained FLOP/s."""
    backward_time_per_sample_s: float | None = Field(default=None, ge=0)
    """Measured per-sample backward time (from `gbmw profile model`); when absent, 2 × the forward time."""
    forward_overhead_s: float = Field(default=0.0, ge=0)
    """Measured time of one forward call that does not grow with the samples (kernel launches, Python): the
    intercept of time against batch size; 0 for analytic models."""
    backward_overhead_s: float = Field(default=0.0, ge=0)
    """The same for one backward call."""
    profiled_batch: int | None = Field(default=None, ge=1)
    """Samples of the calls `tp2_time_s`, `sdp2_time_s` and `ckpt_time_s` timed."""
    tp2_time_s: float | None = Field(default=None, ge=0)
    """Measured forward + backward of the layer on `profiled_batch` samples with TP 2 (runtime's megatron-core
    layers), inside whole-model passes where every layer is TP 2. What the estimator does not explain of it
    (compute / 2, its TP all-reduces) is charged as a per-call overhead to every TP layer — framework costs
    the paper's estimator leaves out."""
    tp2_forward_time_s: float | None = Field(default=None, ge=0)
    """The forward part of `tp2_time_s`: a checkpointed TP layer repeats it (with its framework cost) in
    backward."""
    sdp2_time_s: float | None = Field(default=None, ge=0)
    """The same with every layer sharded 2 ways by FSDP2; the unexplained part (beyond compute, the two
    all-gathers and the reduce-scatter) is charged per call to every SDP layer."""
    ckpt_time_s: float | None = Field(default=None, ge=0)
    """Measured forward + backward of the layer on `profiled_batch` samples on one device with activation
    checkpointing (torch's checkpoint_wrapper), inside whole-model passes where every layer is checkpointed;
    what is not explained by forward + backward + the recomputed forward is charged per call to every
    checkpointed layer."""

    @property
    def stashed_activation_bytes_per_sample(self) -> float:
        """Boundary + intermediate activations of one sample with no TP and no checkpointing."""
        return (
            self.boundary_activation_bytes_per_sample
            + self.intermediate_activation_bytes_per_sample
            + self.intermediate_tp_split_activation_bytes_per_sample
        )

    @model_validator(mode="after")
    def _split_within_total(self) -> "LayerSpec":
        if self.tied_parameter_count and self.tied_to is None:
            raise ValueError(f"tied_parameter_count ({self.tied_parameter_count}) needs tied_to: the layer it shares with")
        if self.tied_parameter_count > self.tp_split_parameter_count:
            raise ValueError(
                f"tied_parameter_count ({self.tied_parameter_count}) > tp_split_parameter_count "
                f"({self.tp_split_parameter_count}): tied weights are vocabulary-parallel under TP"
            )
        if self.tp_split_parameter_count > self.parameter_count:
            raise ValueError(
                f"tp_split_parameter_count ({self.tp_split_parameter_count}) > "
                f"parameter_count ({self.parameter_count}): TP can divide at most all parameters"
            )
        return self


class LayerArrays:
    """The layer fields of a ModelSpec as numpy arrays (one entry per layer) for vectorised costing."""

    def __init__(self, layers: tuple[LayerSpec, ...]):
        def column(field: str) -> np.ndarray:
            return np.array([float(getattr(layer, field) or 0.0) for layer in layers])

        self.parameter_count = column("parameter_count")
        self.tp_split_parameter_count = column("tp_split_parameter_count")
        self.forward_flops_per_sample = column("forward_flops_per_sample")
        self.boundary_activation_bytes_per_sample = column("boundary_activation_bytes_per_sample")
        self.intermediate_activation_bytes_per_sample = column("intermediate_activation_bytes_per_sample")
        self.intermediate_tp_split_activation_bytes_per_sample = column(
            "intermediate_tp_split_activation_bytes_per_sample"
        )
        self.side_input_bytes_per_sample = column("side_input_bytes_per_sample")
        self.tied_parameter_count = column("tied_parameter_count")
        self.tp_allreduce_bytes_per_sample = column("tp_allreduce_bytes_per_sample")
        self.has_measured_time = np.array([layer.forward_time_per_sample_s is not None for layer in layers])
        self.forward_time_per_sample_s = column("forward_time_per_sample_s")
        self.has_measured_backward = np.array([layer.backward_time_per_sample_s is not None for layer in layers])
        self.backward_time_per_sample_s = column("backward_time_per_sample_s")
        self.forward_overhead_s = column("forward_overhead_s")
        self.backward_overhead_s = column("backward_overhead_s")
        self.profiled_batch = column("profiled_batch")
        self.tp2_time_s = column("tp2_time_s")
        self.tp2_forward_time_s = column("tp2_forward_time_s")
        self.sdp2_time_s = column("sdp2_time_s")
        self.ckpt_time_s = column("ckpt_time_s")
        names = [layer.name for layer in layers]
        self.tied_to_index = np.array(
            [names.index(layer.tied_to) if layer.tied_to is not None else -1 for layer in layers]
        )


class ModelSpec(_Frozen):
    """A model as a sequence of layers, with the precision its activation bytes were computed for."""

    name: str
    family: str
    """`gpt`, `bert`, `t5`, `vit`, `swin`, `llama`, `profiled`, …"""
    precision: Precision
    """Training precision the activation bytes assume (16-bit activations for fp16/bf16)."""
    sequence_length: int = Field(ge=1)
    """Tokens per sample of the main stack (encoder length for T5; patches for vision models)."""
    hidden_size: int = Field(ge=1)
    """Width of the main stack (the widest stage for Swin); used by Megatron-style formulas."""
    layers: tuple[LayerSpec, ...] = Field(min_length=1)
    source: str = ""
    """Where the shape comes from (paper, HF config, profile)."""
    architecture: str | None = None
    """For a profile: the architecture it was measured from, as JSON, so the runtime can build the model."""
    optimizer_step_s_per_parameter: float | None = Field(default=None, ge=0)
    """Measured optimizer step time per parameter on the profiled device (`gbmw profile model`); the
    estimator adds the slowest stage's step to each iteration. None: not modelled (analytic models)."""
    slice_gather_time_s: float | None = Field(default=None, ge=0)
    """Measured on the profiling pair: one Slice-Gather of the runtime (forward and backward) between a layout
    sliced in two and a replicated one, on a micro-batch's hidden state of `slice_gather_bytes`. What the
    exchange model does not explain of it is charged to every transition R. None: analytic models."""
    slice_gather_bytes: float | None = Field(default=None, ge=0)
    """The full micro-batch's boundary activation in that measurement (bytes)."""
    p2p_time_s: float | None = Field(default=None, ge=0)
    """Measured on the profiling pair: one pipeline transfer of the runtime (paired isend/irecv, waited) of
    `p2p_bytes`; what the cluster's p2p model does not explain of it is charged to every stage-to-stage
    transfer. None: analytic models."""
    p2p_bytes: float | None = Field(default=None, ge=0)
    """The message of that measurement (bytes)."""

    @model_validator(mode="after")
    def _layers_consistent(self) -> "ModelSpec":
        names = [layer.name for layer in self.layers]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"layer names must be unique; repeated: {duplicates}")
        for index, layer in enumerate(self.layers):
            if layer.tied_to is not None and layer.tied_to not in names:
                raise ValueError(
                    f"layers[{index}] ({layer.name}) is tied_to {layer.tied_to!r}, which is not a layer "
                    f"of this model; known layers include {names[:3]}…"
                )
        return self

    def model_copy(self, *, update=None, deep: bool = False) -> "ModelSpec":
        """pydantic's copy, without the cached `arrays` of the original (they would describe the old layers)."""
        copy = super().model_copy(update=update, deep=deep)
        copy.__dict__.pop("arrays", None)
        return copy

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def parameter_count(self) -> int:
        """Unique parameters: a layer tied to another is not counted twice."""
        return sum(layer.parameter_count - layer.tied_parameter_count for layer in self.layers)

    @property
    def forward_flops_per_sample(self) -> float:
        return float(sum(layer.forward_flops_per_sample for layer in self.layers))

    @functools.cached_property
    def arrays(self) -> LayerArrays:
        return LayerArrays(self.layers)


# ----------------------------------------------------------------------------------------------
# Cluster
# ----------------------------------------------------------------------------------------------


class FlopsPerPrecision(_Frozen):
    """Dense FLOP/s of one device per precision, in TFLOP/s (1e12); absent = not supported."""

    fp32: float = Field(gt=0)
    tf32: float | None = Field(default=None, gt=0)
    fp16: float | None = Field(default=None, gt=0)
    bf16: float | None = Field(default=None, gt=0)


class DeviceSpec(_Frozen):
    name: str
    memory: ByteSize
    """Device memory, e.g. `80GiB`."""
    peak_tflops: FlopsPerPrecision
    """Datasheet dense peak per precision."""
    sustained_tflops: FlopsPerPrecision
    """What Transformer layers reach in practice (calibrated; the source is cited in the recipe)."""

    @model_validator(mode="after")
    def _sustained_below_peak(self) -> "DeviceSpec":
        for precision in ("fp32", "tf32", "fp16", "bf16"):
            peak, sustained = getattr(self.peak_tflops, precision), getattr(self.sustained_tflops, precision)
            if sustained is not None and peak is None:
                raise ValueError(f"sustained_tflops.{precision} is given but peak_tflops.{precision} is not")
            if sustained is not None and sustained > peak:
                raise ValueError(
                    f"sustained_tflops.{precision} ({sustained}) exceeds peak_tflops.{precision} ({peak}); "
                    "sustained must be at most the peak"
                )
        return self


class LinkLevel(_Frozen):
    """One level of the interconnect hierarchy (innermost first): islands of `devices` devices."""

    name: str
    """`intra_node`, `inter_node`, or a finer level such as `pcie_switch`."""
    devices: int = Field(ge=1)
    """Devices in one island at this level; the outermost level's island is the whole cluster."""
    bandwidth_gb_per_s: float = Field(gt=0)
    """Achieved all-reduce bus bandwidth (nccl-tests convention) of a collective spanning one whole
    island of this level with all its devices taking part, in GB/s (1e9 bytes/s)."""
    latency_us: float = Field(default=0.0, ge=0)
    """Per-step latency of a collective at this level, in microseconds."""


class ClusterSpec(_Frozen):
    """Nodes × devices per node, the device, and the bandwidth of each link level."""

    name: str
    nodes: int = Field(ge=1)
    devices_per_node: int = Field(ge=1)
    device: DeviceSpec
    links: tuple[LinkLevel, ...] = Field(min_length=1)
    reserved_memory: ByteSize = ByteSize(0)
    """Device memory the model cannot use (CUDA context, communication buffers, fragmentation)."""
    overlap_slowdown: float = Field(default=1.3, ge=1.0)
    """Slowdown of both compute and communication while they overlap (paper Sec. 5: 1.3)."""
    provenance: Literal["datasheet", "calibrated", "profiled"] = "datasheet"
    sources: tuple[str, ...] = ()

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
        """Sustained FLOP/s of one device for a training precision (fp32 means true fp32, not TF32)."""
        tflops = self._tflops(self.device.sustained_tflops, precision)
        return tflops * 1e12

    def peak_flops(self, precision: str) -> float:
        return self._tflops(self.device.peak_tflops, precision) * 1e12

    def _tflops(self, table: FlopsPerPrecision, precision: str) -> float:
        value = getattr(table, precision, None)
        if value is None:
            supported = [p for p in PRECISIONS if getattr(table, p, None) is not None]
            raise SpecError(
                f"cluster {self.name}: device {self.device.name} has no {precision} FLOP/s; "
                f"supported precisions: {supported}"
            )
        return value


# ----------------------------------------------------------------------------------------------
# Job
# ----------------------------------------------------------------------------------------------


class JobSpec(_Frozen):
    """A model on a cluster with a precision, an optimizer and batch settings: what `gbmw` plans."""

    name: str
    model: ModelSpec
    cluster: ClusterSpec
    precision: Precision
    optimizer: Literal["adam", "sgd"] = "adam"
    global_batch: int | None = Field(default=None, ge=1)
    """Fixed global batch (samples per iteration); None lets the planner sweep."""
    max_global_batch: int = Field(default=4096, ge=1)
    """Upper end of the planner's batch sweep."""
    memory_budget_bytes: int = Field(gt=0)
    """Memory the plan may use per device (the cluster's usable memory unless the job overrides it)."""
    source_path: str = ""
    model_path: str = ""
    """The model recipe, YAML or HF config.json the model was built from (the runtime builds modules from it)."""


# ----------------------------------------------------------------------------------------------
# YAML loading with field-level errors
# ----------------------------------------------------------------------------------------------


def read_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping with `yaml.safe_load`; a missing or malformed file is one SpecError."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise SpecError(f"{path}: no such file") from None
    except OSError as error:
        raise SpecError(f"{path}: cannot read ({error.strerror})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise SpecError(f"{path}: not valid YAML{where}: {problem}") from None
    if not isinstance(data, dict):
        raise SpecError(f"{path}: expected a mapping of fields at the top level, got {type(data).__name__}")
    return data


def describe_validation_error(error: ValidationError, where: str) -> str:
    """One message listing every bad field of `error` as `where: field a.b[2]: value 7 — must be …`."""
    lines = []
    for item in error.errors():
        field = ".".join(str(part) if not isinstance(part, int) else f"[{part}]" for part in item["loc"])
        field = field.replace(".[", "[") or "(top level)"
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "missing":
            lines.append(f"{where}: field `{field}` is required")
        elif item["type"] == "extra_forbidden":
            lines.append(f"{where}: unknown field `{field}` (value {item['input']!r}); check its spelling")
        else:
            value = item.get("input")
            shown = repr(value) if not isinstance(value, dict) else "{…}"
            lines.append(f"{where}: field `{field}`: value {shown} — {message}")
    return "\n".join(lines)


def validate_as(schema: type[BaseModel], data: dict[str, Any], where: str) -> Any:
    """Build `schema` from `data`, turning pydantic's errors into one SpecError naming `where`."""
    try:
        return schema.model_validate(data)
    except ValidationError as error:
        raise SpecError(describe_validation_error(error, where)) from None


def load_cluster(path: str | Path) -> ClusterSpec:
    """Load a ClusterSpec from a YAML file."""
    return validate_as(ClusterSpec, read_yaml(path), str(path))


_BYTE_SIZE = TypeAdapter(ByteSize)


def parse_bytes(text: str | int, where: str) -> int:
    """Parse a memory size such as `16GiB`, `1.5 GB` or a plain byte count (pydantic's ByteSize)."""
    try:
        return int(_BYTE_SIZE.validate_python(text))
    except ValidationError:
        raise SpecError(f"{where}: value {text!r} is not a memory size; write e.g. 16GiB, 80GB or 1073741824") from None


# ----------------------------------------------------------------------------------------------
# Jobs and recipes
# ----------------------------------------------------------------------------------------------

RECIPES_DIR = Path(__file__).resolve().parent.parent / "recipes"


class JobFile(_Frozen):
    """The YAML of a job: which model and cluster (recipe names or paths relative to the job file)."""

    name: str | None = None
    description: str = ""
    model: str
    """A model recipe name (recipes/models/NAME.yaml), a model YAML path, or an HF config.json path."""
    cluster: str
    """A cluster recipe name (recipes/clusters/NAME.yaml) or a cluster YAML path."""
    precision: Precision
    optimizer: Literal["adam", "sgd"] = "adam"
    global_batch: int | None = Field(default=None, ge=1)
    max_global_batch: int = Field(default=4096, ge=1)
    memory_budget: ByteSize | None = None
    """Per-device memory the plan may use; default: the device memory less `reserved_memory`."""


def resolve_recipe(reference: str, kind: str, relative_to: Path | None = None) -> Path:
    """A path for `reference`: an existing path (relative to `relative_to` first), or the name of
    a bundled recipe under recipes/<kind>/."""
    candidates = []
    as_path = Path(reference)
    if relative_to is not None and not as_path.is_absolute():
        candidates.append(relative_to / as_path)
    candidates.append(as_path)
    if as_path.suffix == "":
        candidates.append(RECIPES_DIR / kind / f"{reference}.yaml")
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    bundled = sorted(path.stem for path in (RECIPES_DIR / kind).glob("*.yaml"))
    raise SpecError(
        f"{kind[:-1]} {reference!r}: no such file or bundled recipe; bundled {kind}: {', '.join(bundled) or 'none'}"
    )


def load_job(path: str | Path, memory_budget: str | int | None = None) -> JobSpec:
    """Load a job file (or a bundled job recipe by name) with its model and cluster resolved.

    `memory_budget` (e.g. "16GiB") overrides the job's per-device memory budget.
    """
    from gbmw.models import load_model  # models builds ModelSpecs from architectures

    path = resolve_recipe(str(path), "jobs")
    job = validate_as(JobFile, read_yaml(path), str(path))
    model_path = resolve_recipe(job.model, "models", path.parent)
    cluster_path = resolve_recipe(job.cluster, "clusters", path.parent)
    cluster = load_cluster(cluster_path)
    model = load_model(model_path, job.precision)
    cluster.sustained_flops(job.precision)  # fails early, naming the precisions the device supports
    if memory_budget is not None:
        budget = parse_bytes(memory_budget, "--memory")
    elif job.memory_budget is not None:
        budget = int(job.memory_budget)
    else:
        budget = cluster.usable_memory_bytes
    if budget <= 0:
        raise SpecError(f"{path}: memory budget {budget} bytes is not positive; give e.g. --memory 16GiB")
    return JobSpec(
        name=job.name or path.stem,
        model=model,
        cluster=cluster,
        precision=job.precision,
        optimizer=job.optimizer,
        global_batch=job.global_batch,
        max_global_batch=job.max_global_batch,
        memory_budget_bytes=budget,
        source_path=str(path),
        model_path=str(model_path),
    )
