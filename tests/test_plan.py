"""Plan: validation with arithmetic, exact YAML round trip, atomic never-overwriting saves, uniform configs."""

import pytest
from conftest import make_layer, make_model

from gbmw.cost.estimate import estimate_plan
from gbmw.errors import GbmwError, PlanError
from gbmw.handwritten.uniform_config import UniformConfig
from gbmw.plan import Plan, plan_from_strategy_names
from gbmw.space.stock_partitions import megatron_partition
from gbmw.space.strategy import Strategy
from gbmw.space.technique_support import technique_problems
from gbmw.specs.jobs import load_job


def small_plan(**overrides):
    model = make_model([make_layer(f"l{i}") for i in range(4)])
    fields = dict(names=["tp2-dp2", "tp2-sdp2+ckpt", "dp4", "sdp4"], partition=[2, 2], global_batch=16,
                  num_micro_batches=4)
    fields.update(overrides)
    return plan_from_strategy_names(model, 8, fields.pop("names"), **fields)


def test_yaml_round_trip_is_exact(tmp_path):
    job = load_job("gpt3-15b_a100-80g-x32")
    plan = UniformConfig.parse("tp=4,pp=4,zero=1,ckpt=full,micro=2").to_plan(job)
    plan = Plan(**{**plan.__dict__, "estimate": estimate_plan(job, plan)})
    again = Plan.from_yaml(plan.to_yaml())
    assert again == plan
    assert again.estimate == plan.estimate
    assert again.provenance == plan.provenance
    saved = plan.save(tmp_path / "plan.yaml")
    assert Plan.load(saved) == plan


def test_save_never_overwrites(tmp_path):
    plan = small_plan()
    path = tmp_path / "plan.yaml"
    path.write_text("user's file")
    with pytest.raises(GbmwError, match="exists; gbmw does not overwrite"):
        plan.save(path)
    assert path.read_text() == "user's file"
    assert [p.name for p in tmp_path.iterdir()] == ["plan.yaml"]  # no temporary left behind


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(partition=[3, 2]), r"sum\(partition \[3, 2\]\) = 5 != 4 strategies"),
        (dict(global_batch=18), r"global_batch\(18\) is not divisible by num_micro_batches\(4\)"),
        (dict(global_batch=8, num_micro_batches=4), "micro_batch = 2 is not a multiple of 4"),
        (dict(names=["tp2-dp2", "dp8", "dp4", "dp4"]), r"each stage has num_devices\(8\) / pp\(2\) = 4"),
    ],
)
def test_validation_shows_the_arithmetic(overrides, message):
    with pytest.raises(PlanError, match=message):
        small_plan(**overrides)


def test_heads_not_divisible_by_tp():
    model = make_model([make_layer("a", attention_heads=6), make_layer("b")])
    with pytest.raises(PlanError, match="layer a has 6 attention heads, not divisible by tp=4.*TP degrees that divide it: \\[1, 2\\]"):
        plan_from_strategy_names(model, 8, ["tp4-dp2", "dp8"], [2], 8, 1)


def test_malformed_plan_files():
    text = small_plan().to_yaml()
    with pytest.raises(PlanError, match="not valid YAML"):
        Plan.from_yaml("a: [", "p.yaml")
    with pytest.raises(PlanError, match="unknown field"):
        Plan.from_yaml(text + "colour: red\n", "p.yaml")
    with pytest.raises(PlanError, match="cannot read 'xp2'"):
        Plan.from_yaml(text.replace("tp2-dp2", "xp2"), "p.yaml")
    with pytest.raises(PlanError, match="field `pp`: value 'two'"):
        Plan.from_yaml(text.replace("pp: 2", "pp: two"), "p.yaml")


def test_runs_collapse_equal_neighbours_within_stages():
    plan = small_plan(names=["dp4", "dp4", "dp4", "sdp4"])
    assert [(first, count, s.name) for first, count, s in plan.runs()] == [(0, 2, "dp4"), (2, 1, "dp4"), (3, 1, "sdp4")]


def test_uniform_config_megatron_style():
    job = load_job("gpt3-15b_a100-80g-x32")
    plan = UniformConfig.parse("tp=8,pp=2,zero=1,ckpt=full,micro=1").to_plan(job)
    assert plan.partition == (25, 25)  # 24 blocks per stage, embedding first, head last
    assert plan.strategies[1] == Strategy.parse("tp8-z1dp2+ckpt")
    assert plan.strategies[0] == Strategy.parse("tp8-z1dp2")
    assert plan.micro_batch == 2 and plan.num_micro_batches == 512
    assert megatron_partition(job.model, 4) == [13, 12, 12, 13]


@pytest.mark.parametrize(
    "spec, message",
    [
        ("tp=3", "--uniform tp=3, pp=1: devices\\(32\\) % \\(tp \\* pp = 3\\) != 0"),
        ("tp=1,pp=32", "48 Transformer blocks, not divisible by pp=32"),
        ("tp=8,dp=3", "--uniform dp=3: devices\\(32\\) / \\(tp\\(8\\) \\* pp\\(1\\)\\) = 4"),
        ("zero=4", "ZeRO stages are 0, 1, 2 and 3"),
        ("ckpt=selective,target=deepspeed", r"selective recomputation \(\+sel\): deepspeed does not run it — use "
                                            r"--target megatron-core"),
            ("ckpt=partial", "write full .*, selective .* or none"),
            ("tp=8,sp=maybe", "sp='maybe': write on or off"),
        ("colour=red", "cannot read 'colour=red'"),
        ("tp=8,micro=3", "global batch 1024 is not a multiple of micro\\(3\\) \\* dp\\(4\\) = 12"),
        ("tp=16", "has 40 attention heads, not divisible by tp=16"),
    ],
)
def test_uniform_config_errors(spec, message):
    job = load_job("gpt3-15b_a100-80g-x32")
    with pytest.raises(PlanError, match=message):
        UniformConfig.parse(spec).to_plan(job)


def test_expressibility_per_target():
    from gbmw.space.targets import TARGETS

    def expressibility_problems(plan, model, target):
        return TARGETS[target].problems(plan, model)

    job = load_job("gpt3-15b_a100-80g-x32")
    uniform = UniformConfig.parse("tp=8,pp=2,zero=1,ckpt=full,micro=1").to_plan(job)
    assert expressibility_problems(uniform, job.model, "megatron-deepspeed") == []
    assert expressibility_problems(uniform, job.model, "megatron-core") == []
    assert any("plain DeepSpeed has none" in p for p in expressibility_problems(uniform, job.model, "deepspeed"))
    names = ["tp2-dp8"] * 12 + ["sdp16"] * 13 + ["sdp16"] * 25
    mixed = plan_from_strategy_names(job.model, 32, names, [25, 25], 1024, 64)
    with pytest.raises(PlanError) as error:
        TARGETS["megatron-deepspeed"].check(mixed, job.model)
    message = str(error.value)
    assert "layers 0-11 use tp2-dp8 and 12-49 use sdp16; a megatron-deepspeed job has one parallel layout" in message
    assert "refuses ZeRO-2 and ZeRO-3" in message and "use --target runtime" in message
    zero3 = UniformConfig.parse("pp=2,zero=3,micro=1").to_plan(job)
    assert any("distributed optimizer" in p for p in expressibility_problems(zero3, job.model, "megatron-core"))


def test_megatron_targets_refuse_sequence_parallelism_tp_does_not_divide():
    """Megatron's scatter to the sequence-parallel region asserts that TP divides the sequence
    (megatron.core.tensor_parallel.mappings); a plan whose +sp TP does not is refused with what would work."""
    from gbmw.space.targets import get_target

    model = load_job("gpt-tiny_cpu-x4").model
    strategies = [Strategy.parse("tp4+sp")] * model.num_layers
    assert model.sequence_length % 4 == 0  # the bundled job: every TP divides its sequence
    odd = model.model_copy(update={"sequence_length": model.sequence_length + 2})
    target = get_target("megatron-core")
    assert not target.layers_allowed(odd, strategies).any()
    assert target.layers_allowed(model, strategies).all()
    problems = technique_problems(target, type("P", (), {"strategies": strategies})(), odd)
    assert problems == [f"sequence parallelism (+sp) with TP 4: the sequence of {model.sequence_length + 2} tokens is "
                        "sliced over the TP group, so TP must divide it — use a sequence length TP divides, or no +sp "
                        "there"]
