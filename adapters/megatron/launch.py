"""The shell line that launches a Megatron script (torchrun or DeepSpeed's launcher) with a plan's
arguments."""

from __future__ import annotations

import re
import shlex
from typing import Sequence

from gbmw.errors import GbmwError
from gbmw.plan import Plan
from gbmw.specs.jobs import JobSpec

from .arguments import plan_to_megatron_args
from .layout import plan_target

LAUNCHERS = ("torchrun", "deepspeed")


# ----------------------------------------------------------------------------------------------
# Launch
# ----------------------------------------------------------------------------------------------


def _shell_word(text: str) -> str:
    """A shell word: shlex-quoted, except that `$VAR` references stay expandable (double quotes)."""
    if "$" in text and re.fullmatch(r"[\w$.:{}/-]+", text):
        return f'"{text}"'
    return shlex.quote(text)


def launch_line(
    plan: Plan,
    job: JobSpec,
    script: str = "pretrain_gpt.py",
    target: str = "megatron-core",
    *,
    launcher: str | None = None,
    hostfile: str = "hostfile",
    rdzv_endpoint: str = "$MASTER_ADDR:$MASTER_PORT",
    deepspeed_config: str = "ds_config.json",
    extra_args: Sequence[str] = (),
) -> str:
    """One shell command that launches `script` on the job's cluster with the plan's arguments.

    `launcher` defaults to DeepSpeed's for megatron-deepspeed and torchrun otherwise. DeepSpeed's
    launcher: ``--num_gpus`` per node, and ``--hostfile``/``--num_nodes`` across nodes; it passes
    ``--local_rank=N``, which Megatron-LM's parser (``--local-rank``) rejects, so megatron-core runs
    get ``--no_local_rank`` (Megatron-LM reads LOCAL_RANK). torchrun: ``--standalone`` on one node,
    else ``--nnodes`` with a c10d rendezvous at `rdzv_endpoint`; run the line on every node. TP > 1 or
    context parallelism under Megatron-LM requires CUDA_DEVICE_MAX_CONNECTIONS=1 (its validate_args asserts it on
    pre-Blackwell GPUs), and so does sequence parallelism under Megatron-DeepSpeed (a RuntimeError in its
    validate_args): set in front; across nodes with DeepSpeed's launcher put it in .deepspeed_env.
    `extra_args` (data, tokenizer, optimizer…) follow the plan's arguments.
    """
    args = plan_to_megatron_args(plan, job, target, deepspeed_config=deepspeed_config) + list(extra_args)
    launcher = launcher or ("deepspeed" if target == "megatron-deepspeed" else "torchrun")
    if launcher not in LAUNCHERS:
        raise GbmwError(f"launcher {launcher!r} is unknown; launchers are {list(LAUNCHERS)}")
    nodes, per_node = job.cluster.nodes, job.cluster.devices_per_node
    words: list[str] = []
    first = plan.strategies[0]
    if plan_target(target) == "megatron-core" and (first.tp > 1 or first.degree("cp") > 1) or first.sp:
        words.append("CUDA_DEVICE_MAX_CONNECTIONS=1")
    if launcher == "deepspeed":
        words.append("deepspeed")
        if nodes > 1:
            words += ["--hostfile", hostfile, "--num_nodes", str(nodes)]
        words += ["--num_gpus", str(per_node)]
        if target != "megatron-deepspeed":
            words.append("--no_local_rank")
    else:
        words.append("torchrun")
        words += ["--standalone"] if nodes == 1 else ["--nnodes", str(nodes)]
        words += ["--nproc_per_node", str(per_node)]
        if nodes > 1:
            words += ["--rdzv_backend", "c10d", "--rdzv_endpoint", rdzv_endpoint]
    return " ".join(_shell_word(word) for word in [*words, script, *args])
