"""The process `engine_check` starts: `deepspeed.initialize` on a stand-in model for each config it is sent, and one
training step, on CPU over gloo as rank 0 of 1. Run as `python -m gbmw.adapters.deepspeed.engine_worker RESULTS`
with a JSON list of cases on stdin; writes one JSON object per case to RESULTS (DeepSpeed's own output stays on this
process's stdout and stderr, which the parent keeps from the user).

What this machine cannot do that the GPU the config is written for can, and what is stood in for it (each is said in
the case's `stood_in`, so the user hears what was not checked):

* DeepSpeed's compiled optimizers — FusedAdam, FusedLamb, FusedLion (CUDA kernels) and DeepSpeedCPUAdam / Adagrad /
  Lion (C++ kernels JIT-compiled on first use, minutes on a 2-core machine). DeepSpeed picks one from the config
  (`optimizer.type`, offload); the class it picks is replaced by a stand-in that first binds the config's
  `optimizer.params` to the real class's constructor — so a setting the real optimizer does not take is refused
  as DeepSpeed would refuse it — then steps with torch's Adam(W) on the settings torch takes.
* fp16 where this CPU's oneDNN has no fp16 kernels (DeepSpeed's CPU accelerator then refuses fp16 outright, which
  a GPU never does): the accelerator is told fp16 is supported, and torch's CPU kernels run it.
* DeepSpeed's shared-memory all-reduce op (an inference kernel, compiled with g++ on first use) is not built:
  one process has nothing to reduce.

Everything else is DeepSpeed's own code on the config as given: the engine, ZeRO stages 0–3 and their offload
(to CPU memory), the precision wrappers, the scheduler, gradient clipping, the pipeline engine.

This module is inside gbmw.adapters.deepspeed; `import deepspeed` below is the third-party library.
"""

from __future__ import annotations

import inspect
import json
import os
import sys
import traceback
from typing import Any

STAND_IN_WIDTH = 8
"""Width of the stand-in model's two linear layers: the check is about the config's keys, not the model's size."""


def _kernel_stand_in(real_class: type, where: str, stood_in: list[str]) -> type:
    """A class DeepSpeed constructs in place of `real_class`: the real constructor's signature refuses what the real
    optimizer refuses; torch's Adam or AdamW takes the step."""
    import torch

    signature = inspect.signature(real_class.__init__)

    class StandIn(torch.optim.AdamW):
        def __init__(self, params, *args: Any, **kwargs: Any):
            signature.bind(self, params, *args, **kwargs)  # TypeError: unexpected keyword, as the real one raises
            settings = signature.bind(self, params, *args, **kwargs).arguments
            kept = {key: settings[key] for key in ("lr", "betas", "eps", "weight_decay") if key in settings}
            if isinstance(kept.get("betas"), list):
                kept["betas"] = tuple(kept["betas"])
            super().__init__(params, **kept)
            stood_in.append(f"{where}: DeepSpeed's {real_class.__name__} is a compiled kernel this machine does not "
                            f"build; its settings were checked against {real_class.__name__}'s arguments and the step "
                            "ran with torch's AdamW")

    StandIn.__name__ = f"StandIn{real_class.__name__}"
    return StandIn


def _install_stand_ins(stood_in: list[str]) -> None:
    """Replace DeepSpeed's compiled optimizers (where DeepSpeed's engine imports them from) and the fp16 refusal of a
    CPU without fp16 kernels; see the module docstring."""
    import deepspeed.ops
    from deepspeed.accelerator import get_accelerator
    from deepspeed.ops import adagrad, adam, lamb, lion
    from deepspeed.runtime.zero.utils import ZERO_SUPPORTED_OPTIMIZERS

    for module, name in ((adam, "FusedAdam"), (adam, "DeepSpeedCPUAdam"), (lamb, "FusedLamb"), (lion, "FusedLion"),
                         (lion, "DeepSpeedCPULion"), (adagrad, "DeepSpeedCPUAdagrad")):
        real = getattr(module, name, None)
        if real is not None and not getattr(real, "_gbmw_stand_in", False):
            stand_in = _kernel_stand_in(real, "optimizer", stood_in)
            stand_in._gbmw_stand_in = True
            setattr(module, name, stand_in)
            if real in ZERO_SUPPORTED_OPTIMIZERS:  # ZeRO accepts exactly the classes it lists
                ZERO_SUPPORTED_OPTIMIZERS.append(stand_in)
    accelerator = get_accelerator()
    if not accelerator.is_fp16_supported():
        def fp16_supported() -> bool:
            stood_in.append("fp16: this CPU has no oneDNN fp16 kernels, so DeepSpeed's CPU accelerator refuses fp16 "
                            "(a GPU does not); the step ran on torch's CPU fp16 kernels")
            return True

        accelerator.is_fp16_supported = fp16_supported
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False  # builder.NAME of ShareMemCommBuilder


def _stand_in_model(pipeline: bool):
    """Two linear layers; a one-stage PipelineModule where the config is for DeepSpeed's pipeline engine."""
    import torch

    layers = [torch.nn.Linear(STAND_IN_WIDTH, STAND_IN_WIDTH), torch.nn.ReLU(),
              torch.nn.Linear(STAND_IN_WIDTH, STAND_IN_WIDTH)]
    if not pipeline:
        return torch.nn.Sequential(*layers)
    from deepspeed.pipe import PipelineModule

    return PipelineModule(layers, num_stages=1, loss_fn=torch.nn.MSELoss(), partition_method="uniform")


def _one_step(case: dict[str, Any], stood_in: list[str]) -> None:
    """deepspeed.initialize on the stand-in model with the case's config, then one optimizer step."""
    import deepspeed
    import torch

    config = case["config"]
    torch.manual_seed(0)
    pipeline = case.get("pipeline", False)
    model = _stand_in_model(pipeline)
    client = {}
    if "optimizer" not in config or case.get("client_optimizer"):  # the script passes its own (HF Trainer: torch's
        # AdamW; Megatron-DeepSpeed: its Adam(W) and schedule, whatever the config says)
        client["optimizer"] = torch.optim.AdamW(model.parameters(), lr=1e-3)
        if case.get("client_optimizer"):
            client["lr_scheduler"] = torch.optim.lr_scheduler.LambdaLR(client["optimizer"], lambda step: 1.0)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config, **client)
    dtype = (torch.bfloat16 if engine.bfloat16_enabled() else torch.float16 if engine.fp16_enabled()
             else torch.float32)
    micro = engine.train_micro_batch_size_per_gpu()
    if pipeline:
        batch = (torch.randn(micro, STAND_IN_WIDTH, dtype=dtype), torch.randn(micro, STAND_IN_WIDTH, dtype=dtype))
        loss = engine.train_batch(iter([batch] * engine.gradient_accumulation_steps()))
    else:
        for _ in range(engine.gradient_accumulation_steps()):
            loss = engine(torch.randn(micro, STAND_IN_WIDTH, dtype=dtype)).float().pow(2).mean()
            engine.backward(loss)
            engine.step()
    if not torch.isfinite(torch.as_tensor(loss, dtype=torch.float32)):
        raise RuntimeError(f"the stand-in model's loss is {float(loss)} after one step")
    if engine.global_steps != 1:
        raise RuntimeError(f"DeepSpeed's engine took {engine.global_steps} optimizer steps, not 1")
    del engine


def _deepspeed_key_names() -> set[str]:
    """Every top-level key DeepSpeed's config reads (deepspeed.runtime.constants), to name a key the config lacks."""
    from deepspeed.runtime import constants

    return {value for name, value in vars(constants).items()
            if name.isupper() and isinstance(value, str) and value.isidentifier() and value.islower()}


def _warm_up() -> None:
    """What the first engine would import anyway, before the cases arrive (the parent plans meanwhile): torch's
    compiler stack, which torch's first optimizer imports, and the Muon module ZeRO's optimizer check imports."""
    import torch

    torch.optim.AdamW([torch.zeros(1, requires_grad=True)])
    try:
        import deepspeed.runtime.zero.muon.muon_optimizer  # noqa: F401
    except ImportError:
        pass


def main(results_path: str) -> int:
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    stood_in: list[str] = []
    _install_stand_ins(stood_in)
    import deepspeed

    from .validation import _describe_deepspeed_error

    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
    _warm_up()
    known_keys = _deepspeed_key_names()
    cases = json.load(sys.stdin)
    results = []
    # The pipeline engine leaves its grid in DeepSpeed's module globals: plain engines first.
    for index in sorted(range(len(cases)), key=lambda i: bool(cases[i].get("pipeline"))):
        case = cases[index]
        del stood_in[:]
        try:
            _one_step(case, stood_in)
            results.append((index, {"refusal": None, "stood_in": list(dict.fromkeys(stood_in))}))
        except Exception as error:  # noqa: BLE001 - whatever DeepSpeed raises is its refusal, told in one line
            refusal = _describe_deepspeed_error(error, case["config"], known_keys)
            if "optimizer" not in case["config"] and "client" in refusal:
                refusal += (" (the config has no `optimizer` section, so the training script passes its own: the check "
                            "passed torch's AdamW, as HF Trainer does)")
            results.append((index, {"refusal": refusal,
                                    "stood_in": list(dict.fromkeys(stood_in)),
                                    "traceback": traceback.format_exc(limit=-3)}))
    with open(results_path, "w", encoding="utf-8") as out:
        json.dump([result for _, result in sorted(results, key=lambda item: item[0])], out)
    return 0


if __name__ == "__main__":
    status = main(sys.argv[1])
    # Leave without the interpreter's shutdown, as `gbmw` does under a launcher (gbmw.cli.main.main): with the gloo
    # process group still up, its threads can abort the shutdown ("terminate called without an active exception",
    # status -6; pytorch/pytorch#179291) after the results are written, which the checker would read as a crash (seen
    # once in `make test`, tests/test_gpt3_recipes.py).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
