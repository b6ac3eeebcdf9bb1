"""The fake-tensor trace of the runtime's train step allocates what the real step allocates: on gloo processes,
torch's MemTracker sees the same peak with real tensors as under fake tensors, for plans of every kind — to the
byte where no layer of the rank's stage is sharded, and otherwise up to one in-flight collective buffer more in the
real step. An FSDP2 collective's work holds its buffer until gloo's thread finishes it, so whether a buffer is still
alive at the next allocation depends on timing (under fake tensors every collective finishes at once): the real
peak may exceed the fake one by at most the largest sharded layer's unsharded weights or gradients (fp32), and
never falls below it. That still catches any difference of a stashed activation or a whole extra buffer beside
it; the plans without sharding must agree exactly."""

import pytest

from dist_fixture import run_distributed

pytestmark = [pytest.mark.torch, pytest.mark.dist]

PLANS = [  # (job, processes, per-layer strategies (embedding, 4 blocks, head), partition, micro-batches)
    ("gpt-tiny_cpu-x4", 2, ["tp2", "dp2", "sdp2", "tp2+ckpt", "z1dp2", "z2dp2+ckpt"], [6], 2),
    ("gpt-tiny_cpu-x4", 2, ["single", "single+ckpt", "single", "single", "single", "single"], [2, 4], 3),
    ("gpt-tiny_cpu-x4", 4, ["dp2-tp2", "sdp4", "tp4+ckpt", "z1dp4", "dp4", "tp2-sdp2"], [6], 2),
    ("gpt-tiny_cpu-x4", 4, ["tp2", "sdp2", "dp2+ckpt", "tp2", "z1dp2", "tp2"], [3, 3], 3),
    # LLaMA-style: RMSNorm, SwiGLU, rotary, grouped-query attention (TP 4 leaves one key/value head per rank)
    ("llama-tiny_cpu-x4", 2, ["tp2", "sdp2", "dp2+ckpt", "tp2+ckpt", "z1dp2", "z2dp2"], [6], 2),
    ("llama-tiny_cpu-x4", 4, ["dp2-tp2", "tp4", "sdp4+ckpt", "tp2-sdp2", "z1dp4", "tp4"], [6], 2),
    ("llama-tiny_cpu-x4", 4, ["tp2", "sdp2", "tp2+ckpt", "tp2", "dp2", "tp2"], [3, 3], 3),
    # sequence parallelism (+sp) in some blocks (Korthikanti et al. Sec. 4.2.2)
    ("gpt-tiny_cpu-x4", 2, ["tp2", "tp2+sp", "dp2", "tp2+sp+ckpt", "tp2+sp", "tp2"], [6], 2),
    ("llama-tiny_cpu-x4", 4, ["dp2-tp2", "tp4+sp", "tp2-dp2+sp", "tp2-sdp2+sp+ckpt", "tp4+sp", "tp4"], [6], 2),
]


def _peaks(rank, world_size, job_name, strategies, partition, micro_batches):
    from gbmw.adapters.profile.fake_memory import step_peak, track_rank
    from gbmw.adapters.runtime.engine import AdamSettings
    from gbmw.adapters.runtime.groups import GroupPool
    from gbmw.jobs import load_job
    from gbmw.plan import plan_from_strategy_names
    import torch.distributed as dist

    from gbmw.layer_cost import tp_local_parameters

    job = load_job(job_name)
    plan = plan_from_strategy_names(job.model, world_size, strategies, partition, 8 * micro_batches, micro_batches)
    real = step_peak(plan, job.model.architecture, GroupPool(plan), AdamSettings(max_grad_norm=1.0), fake=False)
    dist.barrier()
    dist.destroy_process_group()  # track_rank brings up the fake backend as this rank (and takes it down)
    fake = track_rank(job, plan, rank)
    stage = rank // (world_size // plan.pp)
    first = sum(plan.partition[:stage])
    in_flight = [tp_local_parameters(job.model, strategy.tp)[layer] * 4
                 for layer, strategy in enumerate(plan.strategies[first:first + plan.partition[stage]], start=first)
                 if any(strategy.degree(axis) > 1 for axis in ("sdp", "z1dp", "z2dp"))]
    return real.peak_bytes, fake.peak_bytes, float(max(in_flight, default=0))


@pytest.mark.parametrize("job, processes, strategies, partition, micro_batches", PLANS)
def test_the_fake_trace_allocates_what_the_real_step_allocates(job, processes, strategies, partition, micro_batches):
    for rank, (real, fake, in_flight) in enumerate(run_distributed(processes, _peaks, job, strategies, partition,
                                                                   micro_batches, timeout_s=240)):
        assert 0 <= real - fake <= in_flight, (rank, real, fake, in_flight)
