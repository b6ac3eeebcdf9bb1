"""gbmw: Galvatron-BMW automatic hybrid parallelism for Transformer training.

The parts, bottom to top (each imports only those below it):

    specs/        model, cluster and job specs; HF import; safe file reading and schemas
    space/        Strategy and decision trees; search spaces; targets and their partition rules
    plan.py       the Plan contract (and ranks.py, its rank math; errors.py, the errors a user can cause)
    cost/         the estimator: layer, communication, memory, stage and pipeline cost
    search/       the outer loop, stage DP, exact search, bounds, partitions
    handwritten/  uniform and published hand-tuned configurations as plans
    cli/          the `gbmw` command, tables and figures, compare
    adapters/     (gbmw.adapters) DeepSpeed, Megatron, the hybrid runtime, profiling; need torch

The planner API (no torch needed):

    import gbmw
    job = gbmw.load_job("gpt3-15b_a100-80g-x32")           # a job YAML path or a bundled recipe name
    plan = gbmw.uniform_plan(job, "tp=8,pp=2,zero=1,ckpt=full,micro=1")
    plan = gbmw.plan_from_strategy_names(job.model, 32, names, partition=[25, 25],
                                         global_batch=512, num_micro_batches=32)
    estimate = gbmw.estimate(job, plan)                       # iteration time, samples/s, stage memory
    best = gbmw.plan_job(job)                                 # the search: the fastest plan that fits
    plan.save("plan.yaml"); gbmw.Plan.load("plan.yaml")
"""

from gbmw.cost.estimate import estimate_plan as estimate
from gbmw.errors import GbmwError, PlanError, SpecError
from gbmw.handwritten.uniform_config import UniformConfig
from gbmw.plan import Estimate, Plan, plan_from_strategy_names
from gbmw.search.nothing_fits import NothingFitsError
from gbmw.search.planner import Planner, plan_job
from gbmw.space.strategy import Strategy, enumerate_strategies
from gbmw.specs.cluster_spec import ClusterSpec, load_cluster
from gbmw.specs.jobs import JobSpec, load_job
from gbmw.specs.model_spec import LayerSpec, ModelSpec
from gbmw.version import __version__


def uniform_plan(job: JobSpec, config: str) -> Plan:
    """A Megatron-style uniform 3D plan from `tp=…,pp=…,zero=…,ckpt=…,micro=…[,batch=…]`."""
    return UniformConfig.parse(config).to_plan(job)


__all__ = [
    "ClusterSpec", "Estimate", "GbmwError", "JobSpec", "LayerSpec", "ModelSpec", "NothingFitsError", "Plan",
    "PlanError", "Planner", "SpecError", "plan_job",
    "Strategy", "UniformConfig", "enumerate_strategies", "estimate", "load_cluster", "load_job",
    "plan_from_strategy_names", "uniform_plan", "__version__",
]
