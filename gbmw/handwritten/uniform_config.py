"""Fixed, hand-written configurations costed by the same estimator as the planner's plans.

`UniformConfig` is a Megatron/DeepSpeed-style 3D configuration — one TP degree, one pipeline
degree, data parallelism over what remains, one ZeRO stage, one recomputation setting and a
per-rank micro-batch — as written on the command line:

    gbmw estimate JOB --uniform tp=8,pp=2,zero=1,ckpt=full,micro=1

It becomes a Plan with the same strategy on every layer (TP innermost on consecutive ranks,
data parallel outside it, pipeline outermost, as Megatron lays out ranks) and Megatron's even
pipeline split, or with split=accounted megatron-core's split counting the embedding and the loss as layers;
v=N interleaves N model chunks per device.
"""

from __future__ import annotations

from dataclasses import dataclass

from gbmw.errors import GbmwError, PlanError
from gbmw.plan import Plan
from gbmw.space.stock_partitions import accounted_candidates, megatron_partition
from gbmw.space.strategy import RECOMPUTE_LEVELS, Strategy
from gbmw.space.targets import AXIS_OF_ZERO_STAGE, get_target
from gbmw.specs.files import shown
from gbmw.specs.jobs import JobSpec
from gbmw.specs.model_spec import ModelSpec
from gbmw.specs.schema import MAX_DEVICES, MAX_GLOBAL_BATCH

UNIFORM_KEYS = {
    "tp": "TP degree, a power of two",
    "pp": "pipeline stages, a power of two",
    "dp": "data-parallel degree: optional, devices / (tp * pp * cp * ulysses)",
    "zero": "ZeRO stage 0-3, 3 = sharded",
    "ckpt": "recomputation: full, selective (the attention core) or none",
    "sp": "sequence parallelism with TP: on or off (default)",
    "cp": "ring context-parallel degree, megatron-core",
    "ulysses": "Ulysses sequence-parallel degree, DeepSpeed",
    "ep": "expert-parallel degree: divides dp, or tp * dp / etp",
    "etp": "the experts' own TP degree: divides tp, with ep >= 2 and sp=on; megatron-core",
    "v": "interleaved 1F1B's model chunks per device, megatron-core",
    "split": "even (default) or accounted: the embedding and the loss counted as layers, megatron-core",
    "micro": "micro-batch size per data-parallel rank",
    "batch": "global batch; default the job's",
    "target": "runtime (default), deepspeed, megatron-deepspeed or megatron-core",
}


@dataclass(frozen=True)
class UniformConfig:
    tp: int = 1
    pp: int = 1
    dp: int | None = None
    zero: int = 0
    ckpt: str = "none"
    sp: bool = False
    cp: int = 1
    ulysses: int = 1
    ep: int = 1
    etp: int | None = None
    """The experts' TP degree (None: tp)."""
    v: int = 1
    """Model chunks per pipeline device (interleaved 1F1B; 1: plain 1F1B)."""
    split: str = "even"
    """`even` (Megatron's equal blocks per stage) or `accounted` (gbmw.space.stock_partitions.accounted_blocks_per_stage)."""
    micro: int = 1
    batch: int | None = None
    target: str = "runtime"
    """What runs the configuration (gbmw.space.targets): its framework decides the memory per parameter."""

    @classmethod
    def parse(cls, text: str) -> "UniformConfig":
        values: dict[str, object] = {}
        known = ", ".join(f"{k} ({v})" for k, v in UNIFORM_KEYS.items())
        items = [part.strip() for part in text.split(",") if part.strip()]
        if not items:
            raise PlanError(f"--uniform {shown(text)}: empty; write key=value pairs joined by ',', e.g. "
                            f"tp=8,pp=2,zero=1,ckpt=full,micro=1 (keys: {known})")
        for item in items:
            key, sep, value = item.partition("=")
            key = key.strip()
            if not sep or key not in UNIFORM_KEYS:
                raise PlanError(f"--uniform: cannot read {shown(item)}; write key=value pairs joined by ',' with keys: "
                                f"{known}")
            if key in values:
                raise PlanError(f"--uniform: {key} is given twice ({key}={values[key]} and {shown(item)}); give it once")
            value = value.strip()
            if key == "target":
                try:
                    values[key] = get_target(value).name
                except GbmwError as error:
                    raise PlanError(f"--uniform target={shown(value)}: {str(error).split('; ', 1)[-1]}") from None
                continue
            if key == "ckpt":
                if value not in RECOMPUTE_LEVELS:
                    raise PlanError(
                        f"--uniform ckpt={shown(value)}: write full (every Transformer block recomputed), selective "
                        "(their attention cores) or none"
                    )
                values[key] = value
                continue
            if key == "split":
                if value not in ("even", "accounted"):
                    raise PlanError(f"--uniform split={shown(value)}: write even (equal Transformer blocks per stage) or "
                                    "accounted (the embedding and the loss counted as layers, megatron-core)")
                values[key] = value
                continue
            if key == "sp":
                if value.lower() not in ("on", "off", "true", "false"):
                    raise PlanError(f"--uniform sp={shown(value)}: write on or off (sequence parallelism with TP)")
                values[key] = value.lower() in ("on", "true")
                continue
            try:
                number = int(value)
            except ValueError:
                raise PlanError(f"--uniform {key}={shown(value)}: must be an integer ({UNIFORM_KEYS[key]})") from None
            if number < (0 if key == "zero" else 1):
                raise PlanError(f"--uniform {key}={number}: must be positive ({UNIFORM_KEYS[key]})")
            if number > (MAX_GLOBAL_BATCH if key in ("micro", "batch") else MAX_DEVICES):
                raise PlanError(f"--uniform {key}={number}: too large ({UNIFORM_KEYS[key]})")
            if key == "zero" and number > 3:
                raise PlanError(f"--uniform zero={number}: ZeRO stages are 0, 1, 2 and 3")
            values[key] = number
        return cls(**values)  # type: ignore[arg-type]

    def to_plan(self, job: JobSpec) -> Plan:
        devices = job.cluster.num_devices
        if self.cp > 1 and self.ulysses > 1:
            raise PlanError(f"--uniform cp={self.cp}, ulysses={self.ulysses}: both split the sequence; give one")
        sequence = self.cp * self.ulysses
        split = self.tp * self.pp * sequence
        axis = "cp" if self.cp > 1 else "ulysses" if self.ulysses > 1 else None
        given = f"tp={self.tp}, pp={self.pp}" + (f", {axis}={sequence}" if axis else "")
        product = "tp * pp" + (f" * {axis}" if axis else "")
        if devices % split:
            raise PlanError(f"--uniform {given}: devices({devices}) % ({product} = {split}) != 0")
        dp = devices // split
        if self.dp is not None and self.dp != dp:
            factors = f"tp({self.tp}) * pp({self.pp})" + (f" * {axis}({sequence})" if axis else "")
            raise PlanError(f"--uniform dp={self.dp}: devices({devices}) / ({factors}) = {dp}; leave dp out or set it "
                            f"to {dp}")
        global_batch = self.batch or job.global_batch
        if global_batch is None:
            raise PlanError(f"--uniform: job {job.name} has no global_batch; add batch=N to --uniform")
        micro_batch = self.micro * dp
        if global_batch % micro_batch:
            raise PlanError(
                f"--uniform: global batch {global_batch} is not a multiple of micro({self.micro}) * dp({dp}) = "
                f"{micro_batch}; DeepSpeed's identity is train_batch = micro * grad_accum * dp"
            )
        get_target(self.target).check_precision(job.precision, job.gradient_reduce_dtype, job.tp_comm_overlap,
                                                job.adam_moments_dtype)
        strategies = self.layer_strategies(job.model, dp)
        plan = Plan(
            model=job.model.name,
            cluster=job.cluster.name,
            num_devices=devices,
            **job.launch_settings(),
            global_batch=global_batch,
            micro_batch=micro_batch,
            num_micro_batches=global_batch // micro_batch,
            pp=self.pp,
            partition=self._partition(job.model),
            virtual_stages=self.v,
            strategies=strategies,
            target=self.target,
            provenance={"made_by": "uniform", "config": self.describe()},
        )
        plan.check_against(job.model, devices)
        get_target(self.target).check(plan, job.model)
        return plan

    def _partition(self, model: ModelSpec) -> tuple[int, ...]:
        """Megatron's even split, or the split counting the embedding and the loss as layers."""
        if self.split == "even":
            return tuple(megatron_partition(model, self.pp))
        candidates = accounted_candidates(model, self.pp)
        if not candidates:
            blocks = int(model.is_block.sum())
            raise PlanError(f"--uniform split=accounted with pp={self.pp}: {model.name}'s {blocks} Transformer blocks + 2 "
                            f"(the embedding and the loss) are not a multiple of pp with two or more per stage; "
                            "use split=even or another pp")
        return candidates[0]

    def layer_strategies(self, model: ModelSpec, dp: int) -> tuple[Strategy, ...]:
        """One strategy per layer of `model`: TP innermost, then `dp`-way data parallelism at the config's ZeRO
        stage; recomputation on Transformer blocks only (stock frameworks never recompute embeddings or heads); with sp=on
        sequence parallelism on every layer, or on the blocks alone where the target runs it there only (gbmw's
        runtime)."""
        sequence = (("cp", self.cp),) if self.cp > 1 else (("ulysses", self.ulysses),) if self.ulysses > 1 else ()
        dims = ((("tp", self.tp),) if self.tp > 1 else ()) + sequence + (
            ((AXIS_OF_ZERO_STAGE[self.zero], dp),) if dp > 1 else ())
        if self.sp and self.tp < 2:
            raise PlanError(f"--uniform sp=on with tp={self.tp}: sequence parallelism splits TP's replicated "
                            "regions; it needs tp >= 2")
        if self.ep > 1 and not model.is_mixture_of_experts:
            raise PlanError(f"--uniform ep={self.ep}: model {model.name} has no experts to split; leave ep out")
        expert_tp = None if self.etp in (None, self.tp) else self.etp
        if expert_tp is not None:
            if self.ep < 2 or not self.sp or self.tp % expert_tp:
                raise PlanError(f"--uniform etp={self.etp}: the experts' own TP degree must divide tp = {self.tp} and "
                                f"goes with ep >= 2 and sp=on (given ep={self.ep}, sp={'on' if self.sp else 'off'}), "
                                f"e.g. tp={self.tp},etp=1,ep=4,sp=on")
            tokens = sequence[0][1] * dp if sequence else dp  # the expert grid takes the cp ranks as they are
            ranks = self.tp * tokens // expert_tp
            what = (f"tp * {sequence[0][0]} * dp / etp = {self.tp} * {sequence[0][1]} * {dp} / {expert_tp}" if sequence
                    else f"tp * dp / etp = {self.tp} * {dp} / {expert_tp}")
            over = "the stage's ranks over the experts' TP degree"
        elif sequence:  # the sequence ranks hold other tokens too: EP spans them first (gbmw.space.strategy)
            (axis, degree), = sequence
            ranks, what = degree * dp, f"{axis} * dp = {degree} * {dp}"
            over = f"the {axis} and data-parallel ranks"
        else:
            ranks, what, over = dp, f"dp = {dp}", "data-parallel ranks"
        if self.ep > 1 and ranks % self.ep:
            raise PlanError(f"--uniform ep={self.ep}: expert parallelism splits the experts over {over}, "
                            f"so it must divide {what}; EP degrees that do: "
                            f"{[2**e for e in range(1, ranks.bit_length()) if ranks % 2**e == 0]}")
        # EP touches the mixture-of-experts blocks only (a stock framework's one EP degree); the others stay at EP 1
        plain = Strategy(dims, sp=self.sp and not get_target(self.target).sequence_parallel_blocks_only)
        block = Strategy(dims, sp=self.sp).with_recompute(self.ckpt)
        expert_block = block.with_expert_parallel(self.ep, expert_tp)
        return tuple((expert_block if layer.num_experts else block) if layer.is_block else plain
                     for layer in model.layers)

    def describe(self) -> str:
        return (f"tp={self.tp},pp={self.pp},zero={self.zero},ckpt={self.ckpt}{',sp=on' if self.sp else ''}"
                f"{f',cp={self.cp}' if self.cp > 1 else ''}{f',ulysses={self.ulysses}' if self.ulysses > 1 else ''}"
                f"{f',ep={self.ep}' if self.ep > 1 else ''}"
                f"{f',etp={self.etp}' if self.etp not in (None, self.tp) else ''}"
                f"{f',v={self.v}' if self.v > 1 else ''}{',split=accounted' if self.split == 'accounted' else ''}"
                f",micro={self.micro}") + (
            f",batch={self.batch}" if self.batch else "") + (f",target={self.target}" if self.target != "runtime" else "")
