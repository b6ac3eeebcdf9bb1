"""gbmw: Galvatron-BMW automatic hybrid parallelism for Transformer training.

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

__version__ = "0.1.0"

from gbmw.baselines import UniformConfig  # noqa: E402
from gbmw.cost import estimate_plan as estimate  # noqa: E402
from gbmw.errors import GbmwError, PlanError, SpecError  # noqa: E402
from gbmw.plan import Estimate, Plan, plan_from_strategy_names  # noqa: E402
from gbmw.planner import NothingFitsError, Planner, plan_job  # noqa: E402
from gbmw.spec import ClusterSpec, JobSpec, LayerSpec, ModelSpec, load_cluster, load_job  # noqa: E402
from gbmw.space import Strategy, enumerate_strategies  # noqa: E402


def uniform_plan(job: JobSpec, config: str) -> Plan:
    """A Megatron-style uniform 3D plan from `tp=…,pp=…,zero=…,ckpt=…,micro=…[,batch=…]`."""
    return UniformConfig.parse(config).to_plan(job)


__all__ = [
    "ClusterSpec", "Estimate", "GbmwError", "JobSpec", "LayerSpec", "ModelSpec", "NothingFitsError", "Plan",
    "PlanError", "Planner", "SpecError", "plan_job",
    "Strategy", "UniformConfig", "enumerate_strategies", "estimate", "load_cluster", "load_job",
    "plan_from_strategy_names", "uniform_plan", "__version__",
]
