"""The strongest check of an emitted ds_config short of the user's job: DeepSpeed's engine starts on it.

`DeepSpeedConfig` (validation.py) parses a config; `deepspeed.initialize` refuses more — an optimizer type DeepSpeed
no longer has, `max_grad_norm` among the optimizer's params, ZeRO-Offload with the script's own optimizer, an
optimizer setting its constructor does not take, precision mixes the engine cannot wrap. `check_engine_starts`
starts the engine on a two-layer stand-in model with the config, in a subprocess (CPU, gloo, one process;
engine_worker.py), takes one optimizer step, and turns a refusal into one GbmwError line naming the key.

The stand-in world is one process, so the config is started as rank 0 of 1 (`stand_in_config`): its batch keys are
restated for a data-parallel size of 1 (the micro-batch and accumulation as written; DeepSpeedConfig has checked the
batch identity on the real device count already) and `sequence_parallel_size` is 1. What HF Trainer fills from
TrainingArguments (the "auto" optimizer and scheduler settings, clipping) is filled with TrainingArguments' defaults.
What this machine cannot run but the GPU can (compiled optimizers, fp16 on a CPU without fp16 kernels) is stood in
for inside the subprocess and said in the returned notes; see engine_worker.py.

Cost: one process that imports torch, DeepSpeed and torch's compiler stack and starts a one-rank gloo group, ~12 s
on a 2-core machine, nearly all of it imports; `EngineChecker` starts it early so the imports overlap the caller's
work, and many configs share one process (`start_engines`).
"""

from __future__ import annotations

import copy
import json
import os
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Any

from gbmw.errors import GbmwError

from .user_config import BATCH_KEYS

WORKER_MODULE = "gbmw.adapters.deepspeed.engine_worker"
HF_TRAINER_DEFAULTS: dict[str, Any] = {
    "lr": 5e-5, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0,
    "warmup_min_lr": 0.0, "warmup_max_lr": 5e-5, "warmup_num_steps": 10, "total_num_steps": 100,
    "gradient_clipping": 1.0,
}
"""What HF Trainer puts in place of an "auto" optimizer / scheduler setting or clipping (transformers'
HfTrainerDeepSpeedConfig.trainer_config_process: TrainingArguments' learning_rate, adam_beta1/2, adam_epsilon,
weight_decay, max_grad_norm defaults); warmup as with --warmup_steps 10 and 100 training steps."""


@dataclass(frozen=True)
class EngineCase:
    """One config to start: `pipeline` for DeepSpeed's pipeline engine (a plan with PP > 1); `client_optimizer` when
    the training script passes its own optimizer even where the config has one (Megatron-DeepSpeed: its optimizer and
    schedule win over the config's)."""

    name: str
    config: dict[str, Any]
    pipeline: bool = False
    client_optimizer: bool = False


@dataclass
class EngineOutcome:
    name: str
    refusal: str | None
    """DeepSpeed's refusal in one line, `KEY: what DeepSpeed said`; None when the engine started and stepped."""
    notes: list[str] = field(default_factory=list)
    """What the stand-in world changed and what this machine stood in for (not checked)."""
    traceback: str = ""


def stand_in_config(config: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The config as the one-process stand-in world starts it, and what was restated (see the module docstring)."""
    config = copy.deepcopy(config)
    notes = []
    micro, accumulation = config.get(BATCH_KEYS[1]), config.get(BATCH_KEYS[2], 1)
    if isinstance(micro, int) and isinstance(accumulation, int):
        restated = micro * accumulation
        if config.get(BATCH_KEYS[0]) != restated:
            notes.append(f"train_batch_size {config.get(BATCH_KEYS[0])} started as {restated} (one process: "
                         f"micro-batch {micro} × accumulation {accumulation})")
        config[BATCH_KEYS[0]] = restated
    if config.get("sequence_parallel_size", 1) != 1:
        notes.append(f"sequence_parallel_size {config['sequence_parallel_size']} started as 1 (one process)")
        config["sequence_parallel_size"] = 1
    autotp = (config.get("tensor_parallel") or {}).get("autotp_size", 1)
    if isinstance(autotp, int) and autotp > 1:
        notes.append(f"tensor_parallel.autotp_size {autotp} started as 1 (one process; AutoTP's split of your model "
                     "is not checked)")
        config["tensor_parallel"]["autotp_size"] = 1
    filled = []
    for section in ("optimizer", "scheduler"):
        params = (config.get(section) or {}).get("params") or {}
        for key, value in params.items():
            if value == "auto" and key in HF_TRAINER_DEFAULTS:
                params[key] = HF_TRAINER_DEFAULTS[key]
                filled.append(f"{section}.params.{key}")
    if config.get("gradient_clipping") == "auto":
        config["gradient_clipping"] = HF_TRAINER_DEFAULTS["gradient_clipping"]
        filled.append("gradient_clipping")
    if filled:
        notes.append(f"{', '.join(filled)} \"auto\" started with TrainingArguments' defaults (HF Trainer fills them)")
    return config, notes


class EngineChecker:
    """The check's process, started on entering — so that its imports (~10 s: torch, DeepSpeed, torch's compiler
    stack) overlap whatever the caller does meanwhile (tune plans) — and sent the configs by `start_engines`. Leaving
    the block ends the process if it is still running."""

    def __init__(self, timeout_s: float = 600.0):
        self.timeout_s = timeout_s
        self._folder: tempfile.TemporaryDirectory | None = None
        self._process: subprocess.Popen | None = None

    def __enter__(self) -> "EngineChecker":
        self._folder = tempfile.TemporaryDirectory(prefix="gbmw-engine-check-")
        folder = self._folder.name
        # DeepSpeed's own output goes to files here, never before gbmw's lines.
        with open(os.path.join(folder, "stdout"), "w") as out, open(os.path.join(folder, "stderr"), "w") as err:
            self._process = subprocess.Popen([sys.executable, "-m", WORKER_MODULE, os.path.join(folder, "results.json")],
                                             stdin=subprocess.PIPE, stdout=out, stderr=err, text=True,
                                             env=_worker_environment(folder))
        return self

    def __exit__(self, *exc: object) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait()
        if self._folder is not None:
            self._folder.cleanup()

    def start_engines(self, cases: list[EngineCase]) -> list[EngineOutcome]:
        """Start every case's config (see the module docstring); one outcome per case, in order. Once per process."""
        assert self._process is not None and self._folder is not None, "use EngineChecker in a with block"
        prepared, restated = [], []
        for case in cases:
            config, notes = stand_in_config(case.config)
            prepared.append({"name": case.name, "config": config, "pipeline": case.pipeline,
                             "client_optimizer": case.client_optimizer})
            restated.append(notes)
        try:
            self._process.communicate(json.dumps(prepared), timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            raise GbmwError(f"starting DeepSpeed's engine on the config took over {self.timeout_s:.0f} s; "
                            "the check was stopped") from None
        results_path = os.path.join(self._folder.name, "results.json")
        if self._process.returncode != 0 or not os.path.exists(results_path):
            with open(os.path.join(self._folder.name, "stderr"), encoding="utf-8", errors="replace") as err:
                last = (err.read().strip().splitlines() or ["(no output)"])[-1]
            raise GbmwError(f"starting DeepSpeed's engine on the config failed outside DeepSpeed's checks: {last}")
        with open(results_path, encoding="utf-8") as results:
            raw = json.load(results)
        return [EngineOutcome(case.name, result["refusal"], notes + result["stood_in"], result.get("traceback", ""))
                for case, notes, result in zip(cases, restated, raw)]

    def check(self, config: dict[str, Any], where: str, pipeline: bool = False) -> list[str]:
        """Start DeepSpeed's engine on `config` and take a step; GbmwError with DeepSpeed's refusal in one line naming
        the key, else the notes on what the check did not cover."""
        outcome = self.start_engines([EngineCase(where, config, pipeline)])[0]
        if outcome.refusal is not None:
            raise GbmwError(f"{where}: DeepSpeed's engine refuses the config: {outcome.refusal}")
        return [f"engine check: {note}" for note in outcome.notes]


def start_engines(cases: list[EngineCase], timeout_s: float = 600.0) -> list[EngineOutcome]:
    """`EngineChecker.start_engines` in a process of its own."""
    with EngineChecker(timeout_s) as checker:
        return checker.start_engines(cases)


def check_engine_starts(config: dict[str, Any], where: str, pipeline: bool = False) -> list[str]:
    """`EngineChecker.check` in a process of its own."""
    with EngineChecker() as checker:
        return checker.check(config, where, pipeline)


def _worker_environment(folder: str) -> dict[str, str]:
    """Rank 0 of 1 on a free local port, DeepSpeed's CPU accelerator, no GPU, and compiled ops cached where they
    were (TORCH_EXTENSIONS_DIR) so a later check does not build them again."""
    env = dict(os.environ)
    env.update(DS_ACCELERATOR="cpu", CUDA_VISIBLE_DEVICES="", RANK="0", LOCAL_RANK="0", WORLD_SIZE="1",
               LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()),
               OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "1"))
    return env


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
