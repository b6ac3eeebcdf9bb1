"""What `gbmw profile model` measured of one layer (gbmw.specs.model_spec.LayerSpec.timings)."""

from __future__ import annotations

from pydantic import Field

from gbmw.specs.schema import MAX_GLOBAL_BATCH, MAX_QUANTITY, Frozen


class LayerTimings(Frozen):
    """What `gbmw profile model` measured of one layer on one device (times in seconds)."""

    forward_time_per_sample_s: float = Field(ge=0, le=MAX_QUANTITY)
    """Forward time per sample; without timings, time is `forward_flops_per_sample` over sustained FLOP/s."""
    backward_time_per_sample_s: float | None = Field(default=None, ge=0, le=MAX_QUANTITY)
    """Backward time per sample; None: 2 × the forward time."""
    forward_overhead_s: float = Field(default=0.0, ge=0, le=MAX_QUANTITY)
    """Time of one forward call that does not grow with the samples (kernel launches, Python): the
    intercept of time against batch size."""
    backward_overhead_s: float = Field(default=0.0, ge=0, le=MAX_QUANTITY)
    """The same for one backward call."""
    profiled_batch: int | None = Field(default=None, ge=1, le=MAX_GLOBAL_BATCH)
    """Samples of the calls `tp2_time_s`, `sdp2_time_s` and `ckpt_time_s` timed."""
    tp2_time_s: float | None = Field(default=None, ge=0, le=MAX_QUANTITY)
    """Forward + backward of the layer on `profiled_batch` samples with TP 2 (the runtime's megatron-core
    layers), inside whole-model passes where every layer is TP 2. What the estimator does not explain of it
    (compute / 2, its TP all-reduces) is charged as a per-call overhead to every TP layer — framework costs
    the paper's estimator leaves out."""
    tp2_forward_time_s: float | None = Field(default=None, ge=0, le=MAX_QUANTITY)
    """The forward part of `tp2_time_s`: a checkpointed TP layer repeats it (with its framework cost) in
    backward."""
    sdp2_time_s: float | None = Field(default=None, ge=0, le=MAX_QUANTITY)
    """The same with every layer sharded 2 ways by FSDP2; the unexplained part (beyond compute, the two
    all-gathers and the reduce-scatter) is charged per call to every SDP layer."""
    ckpt_time_s: float | None = Field(default=None, ge=0, le=MAX_QUANTITY)
    """Forward + backward of the layer on `profiled_batch` samples on one device with activation
    checkpointing (torch's checkpoint_wrapper), inside whole-model passes where every layer is checkpointed;
    what is not explained by forward + backward + the recomputed forward is charged per call to every
    checkpointed layer."""
