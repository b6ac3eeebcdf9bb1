"""A ds_config's optimizer, learning-rate schedule, gradient clipping, loss scaling and offload → Megatron arguments.

Megatron builds its own optimizer and schedule from its arguments. Megatron-LM never reads a ds_config, and
Megatron-DeepSpeed hands its own optimizer and OptimizerParamScheduler to `deepspeed.initialize`, where a client
optimizer and scheduler win over the config's `optimizer` and `scheduler` sections (DeepSpeedEngine
`_configure_optimizer`, `_configure_lr_scheduler`). So a job moved to Megatron keeps its training settings only if
they are restated as flags. Each setting is read as DeepSpeed would run it (DeepSpeed's defaults where a key is
absent) and written as the flag that makes Megatron do the same; a setting no flag expresses becomes a note naming
the key, never a silent drop.

    ds_config                                        Megatron flag (both targets unless said)
    optimizer Adam / AdamW                           --optimizer adam (Megatron's Adam decouples weight decay:
                                                     apex/TE FusedAdam, torch AdamW)
      params.lr, betas, eps, weight_decay            --lr, --adam-beta1/2, --adam-eps, --weight-decay
    optimizer SGD                                    --optimizer sgd --lr --weight-decay --sgd-momentum
    scheduler none                                   --lr-decay-style constant (Megatron's default decays linearly)
    WarmupLR      min, max, warmup steps             --lr max --lr-warmup-iters steps --lr-decay-style constant
    WarmupDecayLR + total_num_steps                  --lr-decay-style linear --lr-decay-iters total --min-lr min
    WarmupCosineLR  ratios of the optimizer's lr     --lr-decay-style cosine --lr-decay-iters total
                                                     --min-lr lr × cos_min_ratio
      warm-up start (min lr, lr × warmup_min_ratio)  Megatron-LM: --lr-warmup-init; Megatron-DeepSpeed warms
                                                     up from 0 (a note when the start is not 0)
    gradient_clipping (DeepSpeed default 0: none)    --clip-grad
    fp16 loss_scale > 0                              --loss-scale
    fp16 initial_scale_power, loss_scale_window,     --initial-loss-scale 2^power, --loss-scale-window,
         hysteresis, min_loss_scale                  --hysteresis, --min-loss-scale
    zero_optimization.offload_optimizer cpu/nvme     Megatron-DeepSpeed: --cpu-optimizer (DeepSpeedCPUAdam, which
                                                     ZeRO-Offload needs); Megatron-LM: --optimizer-cpu-offload
                                                     --use-precision-aware-optimizer --optimizer-offload-fraction
                                                     (cpu, with the distributed optimizer only)
    zero_optimization.offload_param cpu/nvme         Megatron-DeepSpeed (ZeRO-3): --remote-device [--use-pin-memory]
    steps_per_print                                  --log-interval

Under Megatron-DeepSpeed the engine still clips, scales losses and offloads from the ds_config; the flags say the
same so the two never disagree. Megatron's schedules count iterations: train with --train-iters, not
--train-samples (its validate_args refuses --lr-warmup-iters and --lr-decay-iters with samples). Megatron leaves
biases and norm weights out of weight decay (its parameter groups), as HF Trainer does and a bare ds_config does
not. Flags from Megatron-DeepSpeed's megatron/arguments.py and Megatron-LM core_v0.16.1's
megatron/training/arguments.py and training_config.py SchedulerConfig.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from gbmw.errors import GbmwError
from gbmw.plan import Plan
from gbmw.specs.files import shown
from gbmw.specs.jobs import JobSpec

from .layout import megatron_layout, plan_target

DEEPSPEED_ADAM_DEFAULTS = {"lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0}
"""deepspeed.ops.adam.FusedAdam's (and DeepSpeedCPUAdam's) defaults: what a ds_config's Adam runs without a key.
torch's AdamW (`torch_adam: true` in AdamW mode) defaults weight_decay to 0.01."""
FP16_DEFAULTS = {"loss_scale": 0, "initial_scale_power": 16, "loss_scale_window": 1000, "hysteresis": 2,
                 "min_loss_scale": 1}
"""DeepSpeed's fp16 section defaults (deepspeed/runtime/precision_config.py); Megatron's initial loss scale is 2^32."""
SCHEDULERS = ("WarmupLR", "WarmupDecayLR", "WarmupCosineLR")
"""DeepSpeed schedules Megatron's OptimizerParamScheduler can run (linear warm-up, then constant, linear, cosine)."""
_IMPLEMENTATION_KEYS = ("torch_adam", "fused", "foreach", "fp32_optimizer_states")
"""Adam parameters that choose DeepSpeed's implementation, not the update: Megatron picks its own."""
_READ_ELSEWHERE = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                   "activation_checkpointing", "pipeline", "sequence_parallel_size", "bfloat16")
"""Top-level keys whose meaning the plan's own arguments carry (batch, recomputation, pipeline, Ulysses, precision)."""


@dataclass(frozen=True)
class TrainingArguments:
    """Megatron flags restating a ds_config's training settings, and what they could not restate."""

    arguments: tuple[str, ...]
    """Flags and values, in the order of the table in the module docstring."""
    notes: tuple[str, ...]
    """One line per setting no flag carries, naming its ds_config key."""


def ds_config_training_arguments(config: dict[str, Any], target: str, *, precision: str,
                                 distributed_optimizer: bool = False, zero_stage: int = 0,
                                 where: str = "ds_config") -> TrainingArguments:
    """The Megatron flags that make `target` train with `config`'s optimizer, schedule, clipping, loss scaling and
    offload (see the module docstring). `precision` is the plan's (its --bf16/--fp16 come from the plan's
    arguments; fp16 adds the loss-scale flags), `distributed_optimizer` whether the plan shards the optimizer
    (Megatron-LM's CPU offload needs it), `zero_stage` the plan's (parameter offload needs 3); `where` names the
    config in notes and errors. A value of the wrong type is one GbmwError naming the key."""
    reader = _Reader(config, where, megatron_lm=plan_target(target) == "megatron-core")
    optimizer_lr = reader.optimizer()
    reader.schedule(optimizer_lr)
    reader.clipping()
    if precision == "fp16":
        reader.loss_scaling()
    reader.offload(distributed_optimizer, zero_stage)
    if "steps_per_print" in config:
        reader.add("--log-interval", reader.whole("steps_per_print", config["steps_per_print"], minimum=1))
    if reader.megatron_lm:
        reader.unread_keys()
    return TrainingArguments(tuple(reader.arguments), tuple(reader.notes))


def plan_training_arguments(config: dict[str, Any], plan: Plan, job: JobSpec, target: str,
                            where: str = "ds_config") -> TrainingArguments:
    """`ds_config_training_arguments` for the job a plan runs: its precision, distributed optimizer and ZeRO stage."""
    layout = megatron_layout(plan, job, target)
    return ds_config_training_arguments(config, target, precision=plan.precision,
                                        distributed_optimizer=layout.data_axis == "z1dp",
                                        zero_stage=layout.zero_stage, where=where)


class _Reader:
    """Reads one ds_config section after another into `arguments` and `notes`."""

    def __init__(self, config: dict[str, Any], where: str, megatron_lm: bool):
        self.config, self.where, self.megatron_lm = config, where, megatron_lm
        self.megatron = "Megatron-LM" if megatron_lm else "Megatron-DeepSpeed"
        self.arguments: list[str] = []
        self.notes: list[str] = []
        self.optimizer_kind = "adam"
        """The --optimizer written (Megatron's default, adam, when the config has no optimizer)."""

    # ------------------------------------------------------------------ values

    def add(self, flag: str, value: Any = None) -> None:
        self.arguments += [flag] if value is None else [flag, _number(value)]

    def note(self, key: str, why: str) -> None:
        self.notes.append(f"{self.where}: `{key}` is not carried to {self.megatron}'s arguments: {why}")

    def section(self, key: str) -> dict[str, Any]:
        value = self.config.get(key)
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise GbmwError(f"{self.where}: key `{key}`: value {shown(value)} is not an object; DeepSpeed reads "
                            f"`{key}` as {{...}}")
        return value

    def auto(self, key: str, value: Any, flag: str) -> bool:
        """True (and a note) for HF Trainer's "auto", which only HF Trainer fills."""
        if value == "auto":
            self.note(key, f"\"auto\" is filled by HF Trainer, which Megatron does not run; give {flag} yourself")
            return True
        return False

    def number(self, key: str, value: Any, minimum: float = 0.0) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or value < minimum:
            raise GbmwError(f"{self.where}: key `{key}`: value {shown(value)} is not a number ≥ {minimum:g}")
        return value

    def whole(self, key: str, value: Any, minimum: int = 0) -> int:
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise GbmwError(f"{self.where}: key `{key}`: value {shown(value)} is not a whole number ≥ {minimum}")
        return value

    # ------------------------------------------------------------------ sections

    def optimizer(self) -> float | None:
        """The optimizer's flags; its learning rate (None when unknown: no section, or "auto")."""
        section = self.section("optimizer")
        if not section:
            self.note("optimizer", "the config has none, so the training script chose it; Megatron's adam with its "
                      "defaults (weight decay 0.01, no --lr) applies — give --optimizer, --lr and --weight-decay")
            return None
        kind = section.get("type")
        params = section.get("params") or {}
        if not isinstance(params, dict):
            raise GbmwError(f"{self.where}: key `optimizer.params`: value {shown(params)} is not an object")
        name = str(kind).lower()
        if name == "sgd":
            self.optimizer_kind = "sgd"
            return self._sgd(params)
        if name not in ("adam", "adamw"):
            self.note("optimizer.type", f"{shown(kind)} has no Megatron counterpart (--optimizer adam or sgd); "
                      "its lr, betas, eps and weight_decay are given to Megatron's adam — choose the optimizer "
                      "yourself")
        torch_adamw = bool(params.get("torch_adam")) and (name == "adamw" or params.get("adam_w_mode", True))
        defaults = {**DEEPSPEED_ADAM_DEFAULTS, "weight_decay": 0.01 if torch_adamw else 0.0}
        self.add("--optimizer", "adam")
        lr = self._lr(params, defaults["lr"])
        betas = params.get("betas", defaults["betas"])
        if not self.auto("optimizer.params.betas", betas, "--adam-beta1 and --adam-beta2"):
            if not isinstance(betas, (list, tuple)) or len(betas) != 2:
                raise GbmwError(f"{self.where}: key `optimizer.params.betas`: value {shown(betas)} is not a pair "
                                "[beta1, beta2]")
            self.add("--adam-beta1", self.number("optimizer.params.betas", betas[0]))
            self.add("--adam-beta2", self.number("optimizer.params.betas", betas[1]))
        self._plain(params, "eps", "--adam-eps", defaults["eps"])
        self._plain(params, "weight_decay", "--weight-decay", defaults["weight_decay"])
        if name == "adam" and params.get("adam_w_mode") is False:
            self.note("optimizer.params.adam_w_mode", "false asks for Adam with L2 weight decay; Megatron's adam "
                      "decouples weight decay (AdamW), which the arguments give")
        for key in params:
            if key not in ("lr", "betas", "eps", "weight_decay", "adam_w_mode", *_IMPLEMENTATION_KEYS):
                self.note(f"optimizer.params.{key}", "Megatron's adam has no such setting")
        return lr

    def _sgd(self, params: dict[str, Any]) -> float | None:
        self.add("--optimizer", "sgd")
        lr = self._lr(params, None)
        self._plain(params, "weight_decay", "--weight-decay", 0.0)
        self._plain(params, "momentum", "--sgd-momentum", 0.0)  # torch.optim.SGD's defaults
        for key in params:
            if key not in ("lr", "weight_decay", "momentum") and params[key] not in (False, 0):
                self.note(f"optimizer.params.{key}", "Megatron's sgd has no such setting")
        return lr

    def _lr(self, params: dict[str, Any], default: float | None) -> float | None:
        lr = params.get("lr", default)
        if lr is None:
            self.note("optimizer.params.lr", "absent (torch's SGD requires one); give --lr yourself")
            return None
        return None if self.auto("optimizer.params.lr", lr, "--lr") else self.number("optimizer.params.lr", lr)

    def _plain(self, params: dict[str, Any], key: str, flag: str, default: float) -> None:
        value = params.get(key, default)
        if not self.auto(f"optimizer.params.{key}", value, flag):
            self.add(flag, self.number(f"optimizer.params.{key}", value))

    def schedule(self, optimizer_lr: float | None) -> None:
        """The learning-rate schedule's flags; --lr is written here (the schedule sets the peak)."""
        section = self.section("scheduler")
        kind = section.get("type")
        params = section.get("params") or {}
        if not isinstance(params, dict):
            raise GbmwError(f"{self.where}: key `scheduler.params`: value {shown(params)} is not an object")
        if not section:  # DeepSpeed keeps the optimizer's learning rate
            if optimizer_lr is not None:
                self.add("--lr", optimizer_lr)
            self.add("--lr-decay-style", "constant")
            return
        if kind not in SCHEDULERS:
            if optimizer_lr is not None:
                self.add("--lr", optimizer_lr)
            self.note("scheduler", f"{shown(kind)} has no Megatron schedule (linear warm-up, then constant, linear, "
                      "cosine or inverse-square-root decay); Megatron's default (linear decay to --min-lr over "
                      "--train-iters) applies — choose --lr-decay-style yourself")
            return
        value = lambda key, default: params.get(key, default)  # noqa: E731
        if kind == "WarmupCosineLR":
            peak = optimizer_lr
            if peak is None:
                self.note("scheduler.params", "WarmupCosineLR's rates are ratios of the optimizer's lr, which is "
                          "unknown here; give --lr, --min-lr and --lr-warmup-init yourself")
            ratios = {key: value(key, default) for key, default in (("warmup_min_ratio", 0.0), ("cos_min_ratio", 1e-4))}
            ratios = {key: None if self.auto(f"scheduler.params.{key}", ratio, "--min-lr") else
                      self.number(f"scheduler.params.{key}", ratio) for key, ratio in ratios.items()}
            start = None if peak is None or ratios["warmup_min_ratio"] is None else peak * ratios["warmup_min_ratio"]
            floor = None if peak is None or ratios["cos_min_ratio"] is None else peak * ratios["cos_min_ratio"]
        else:
            peak = value("warmup_max_lr", optimizer_lr if kind == "WarmupLR" else 1e-3)
            if peak is None:
                self.note("scheduler.params.warmup_max_lr", "absent, and the optimizer's lr is unknown; give --lr")
            elif self.auto("scheduler.params.warmup_max_lr", peak, "--lr"):
                peak = None
            else:
                peak = self.number("scheduler.params.warmup_max_lr", peak)
            start = value("warmup_min_lr", 0.0)
            start = None if self.auto("scheduler.params.warmup_min_lr", start, "--min-lr") else \
                self.number("scheduler.params.warmup_min_lr", start)
            floor = start
        if peak is not None:
            self.add("--lr", peak)
        decay = {"WarmupLR": "constant", "WarmupDecayLR": "linear", "WarmupCosineLR": "cosine"}[kind]
        self.add("--lr-decay-style", decay)
        warmup = value("warmup_num_steps", 1000)
        if not self.auto("scheduler.params.warmup_num_steps", warmup, "--lr-warmup-iters"):
            # DeepSpeed warms up over at least 2 steps (WarmupLR, WarmupCosineLR: max(2, warmup_num_steps))
            self.add("--lr-warmup-iters", max(2, self.whole("scheduler.params.warmup_num_steps", warmup, minimum=1)))
        if decay != "constant":
            total = params.get("total_num_steps")
            if total is None:
                self.note("scheduler.params.total_num_steps", f"{kind} needs it (DeepSpeed refuses the config "
                          "without it); Megatron decays over --train-iters")
            elif not self.auto("scheduler.params.total_num_steps", total, "--lr-decay-iters"):
                self.add("--lr-decay-iters", self.whole("scheduler.params.total_num_steps", total, minimum=1))
            if floor is not None:
                self.add("--min-lr", floor)
        warmup_type = params.get("warmup_type")
        if warmup_type != "linear":
            self.note("scheduler.params.warmup_type", ("absent, so DeepSpeed warms up on its default log curve"
                                                       if warmup_type is None else f"{shown(warmup_type)} warms up "
                                                       "on a log curve") + "; Megatron's warm-up is linear, which "
                      "the arguments give (write \"warmup_type\": \"linear\" to make both the same)")
        if start:
            if self.megatron_lm:
                self.add("--lr-warmup-init", start)
            else:
                self.note("scheduler.params." + ("warmup_min_ratio" if kind == "WarmupCosineLR" else "warmup_min_lr"),
                          f"the warm-up starts at {start:g}; Megatron-DeepSpeed's warms up from 0")
        for key in params:
            if key not in ("warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type", "total_num_steps",
                           "warmup_min_ratio", "cos_min_ratio", "last_batch_iteration"):
                self.note(f"scheduler.params.{key}", f"{kind} takes no such parameter")

    def clipping(self) -> None:
        clip = self.config.get("gradient_clipping", 0.0)  # DeepSpeed's default: no clipping; Megatron's: 1.0
        if not self.auto("gradient_clipping", clip, "--clip-grad"):
            self.add("--clip-grad", self.number("gradient_clipping", clip))

    def loss_scaling(self) -> None:
        section = {**FP16_DEFAULTS, **self.section("fp16")}
        values = {key: section[key] for key in FP16_DEFAULTS}
        if any(self.auto(f"fp16.{key}", value, "the loss-scale flags") for key, value in values.items()):
            return
        if self.number("fp16.loss_scale", values["loss_scale"]) > 0:
            self.add("--loss-scale", values["loss_scale"])
        else:
            self.add("--initial-loss-scale", 2 ** self.whole("fp16.initial_scale_power", values["initial_scale_power"]))
            self.add("--loss-scale-window", self.whole("fp16.loss_scale_window", values["loss_scale_window"], 1))
            self.add("--hysteresis", self.whole("fp16.hysteresis", values["hysteresis"], 1))
            self.add("--min-loss-scale", self.number("fp16.min_loss_scale", values["min_loss_scale"]))
        for key in ("consecutive_hysteresis", "auto_cast", "fp16_master_weights_and_grads"):
            if section.get(key):
                self.note(f"fp16.{key}", "Megatron has no such setting")

    def offload(self, distributed_optimizer: bool, zero_stage: int) -> None:
        zero = self.section("zero_optimization")
        device = lambda key: (zero.get(key) or {}).get("device", "none")  # noqa: E731
        optimizer_device, param_device = device("offload_optimizer"), device("offload_param")
        adam = self.optimizer_kind == "adam"
        if optimizer_device in ("cpu", "nvme"):
            key = "zero_optimization.offload_optimizer"
            if not adam:
                self.note(key, "Megatron offloads Adam only")
            elif not self.megatron_lm:
                self.add("--cpu-optimizer")  # DeepSpeedCPUAdam: ZeRO-Offload refuses other client optimizers
            elif optimizer_device == "nvme":
                self.note(key, "Megatron-LM offloads optimizer states to CPU memory only, not to NVMe")
            elif not distributed_optimizer:
                self.note(key, "Megatron-LM's CPU offload needs the distributed optimizer, which this plan does "
                          "not use")
            else:
                ratio = (zero.get("offload_optimizer") or {}).get("ratio", 1.0)
                self.add("--optimizer-cpu-offload")
                self.add("--use-precision-aware-optimizer")
                self.add("--optimizer-offload-fraction", self.number(f"{key}.ratio", ratio))
                self.notes.append(f"{self.where}: `{key}` is carried (--optimizer-cpu-offload); gbmw's estimate keeps "
                                  "optimizer states on the device, so the plan fits without it")
        if param_device in ("cpu", "nvme"):
            key = "zero_optimization.offload_param"
            if self.megatron_lm:
                self.note(key, "Megatron-LM has no parameter offload")
            elif zero_stage != 3:
                self.note(key, f"only ZeRO-3 offloads parameters; the plan's ZeRO stage is {zero_stage}")
            else:
                self.add("--remote-device", param_device)
                if (zero.get("offload_param") or {}).get("pin_memory"):
                    self.add("--use-pin-memory")

    def unread_keys(self) -> None:
        """Megatron-LM never reads the ds_config: one note listing what it held beyond the sections restated."""
        restated = ("optimizer", "scheduler", "gradient_clipping", "fp16", "bf16", "steps_per_print")
        unread = [key for key in self.config if key not in (*restated, *_READ_ELSEWHERE, "zero_optimization")]
        unread += [f"zero_optimization.{key}" for key in self.section("zero_optimization")
                   if key not in ("stage", "offload_optimizer", "offload_param")]
        if unread:
            self.notes.append(f"{self.where}: Megatron-LM does not read a ds_config; settings not restated as its "
                              f"arguments: {', '.join(f'`{key}`' for key in unread)}")


def _number(value: Any) -> str:
    """A flag's value: whole numbers without a point, floats in Python's shortest exact form (1e-08, 0.0001)."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(value) if isinstance(value, float) else str(value)
