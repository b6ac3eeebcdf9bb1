"""The stage search and the estimate read one stage cost model (gbmw.cost.stage_cost): whatever strategies the search
returns for a stage, stage_estimate of those strategies gives the objective and memory the search found."""

import numpy as np
import pytest
from conftest import make_cluster, make_layer, make_model
from hypothesis import given, settings
from hypothesis import strategies as st

from gbmw.cost.comm import CommModel
from gbmw.cost.layer_cost import CostSettings
from gbmw.cost.stage_cost import StageCosts, stage_estimate, strategy_tables
from gbmw.search.stage_dp.stage_search import StageSearch
from gbmw.space.strategy import enumerate_strategies

# Relative tolerance of sums of the same terms added in another order: each of the ≤ 2·8 + 2 additions of a
# stage (layer times, transitions, sends) rounds by at most 2^-53 of the running total, so 1e-12 allows ~4500
# roundings; a term missing or counted twice (the smallest is a 1e-9 s latency against totals below 1e-2 s
# in these models) would differ by more than 1e-7.
SUM_ORDER_RTOL = 1e-12

layer_values = st.fixed_dictionaries(dict(
    parameter_count=st.integers(100, 5000), split=st.floats(0.0, 1.0), flops=st.floats(1e5, 1e8),
    boundary=st.floats(10.0, 1e4), intermediate=st.floats(0.0, 1e4), split_intermediate=st.floats(0.0, 1e5),
    side=st.sampled_from([0.0, 0.0, 500.0]),
))


def random_model(values, tie_head):
    layers = []
    for index, v in enumerate(values):
        fields = dict(parameter_count=v["parameter_count"], tp_split_parameter_count=int(v["parameter_count"] * v["split"]),
                      forward_flops_per_sample=v["flops"], boundary_activation_bytes_per_sample=round(v["boundary"]),
                      intermediate_activation_bytes_per_sample=v["intermediate"],
                      intermediate_tp_split_activation_bytes_per_sample=v["split_intermediate"],
                      side_input_bytes_per_sample=v["side"] if index else 0.0)
        if tie_head and index == len(values) - 1:
            fields.update(kind="head", tied_to="l0", tied_parameter_count=min(fields["tp_split_parameter_count"],
                                                                             values[0]["parameter_count"] // 2))
        layers.append(make_layer(f"l{index}", **fields))
    if tie_head:
        first = layers[0]
        layers[0] = first.model_copy(update={"tp_split_parameter_count": max(first.tp_split_parameter_count,
                                                                               layers[-1].tied_parameter_count)})
    return make_model(layers)


@settings(max_examples=60, deadline=None)
@given(values=st.lists(layer_values, min_size=2, max_size=6), tie_head=st.booleans(), pp=st.sampled_from([1, 2]),
       micro_batch=st.sampled_from([4, 8]), num_micro_batches=st.sampled_from([1, 3]), exact=st.booleans(),
       budget_fraction=st.floats(0.05, 1.0), data=st.data())
def test_search_value_is_the_estimate_of_what_it_returns(values, tie_head, pp, micro_batch, num_micro_batches, exact,
                                                         budget_fraction, data):
    model = random_model(values, tie_head)
    cluster = make_cluster(latency_us=1.0)
    comm = CommModel(cluster)
    strategies = [s for s in enumerate_strategies(8 // pp) if micro_batch % s.data_parallel == 0]
    tables = strategy_tables(model, strategies, micro_batch, CostSettings(cluster, "fp32"), comm)
    costs = StageCosts(model, tables, pp, num_micro_batches, "1f1b", comm)
    loosest = (tables.model_state_bytes + 2 * tables.forward_memory_bytes + tables.backward_memory_bytes).max(axis=0)
    budget = float(loosest.sum() * budget_fraction)
    search = StageSearch(costs, budget, granularity_bytes=256, exact=exact)
    cut = data.draw(st.integers(1, model.num_layers - 1)) if pp == 2 else model.num_layers
    for stage, (first, end) in enumerate([(0, cut), (cut, model.num_layers)][:pp]):
        solution = search.solve(stage, first, end)
        if solution is None:
            continue
        estimate = stage_estimate(costs, stage, first, solution.strategy_indices)
        objective = (num_micro_batches - 1) * estimate.time_no_grad_sync_s + estimate.time_s
        assert solution.objective_s == pytest.approx(objective, rel=SUM_ORDER_RTOL)
        assert estimate.forward_backward_peak_bytes <= budget * (1 + SUM_ORDER_RTOL)
        if exact:  # every term rounded up to 256-byte units: at most one unit per term above the estimate
            assert estimate.forward_backward_peak_bytes <= solution.memory_bytes <= estimate.forward_backward_peak_bytes + 256 * 3 * len(values)
        else:
            assert solution.memory_bytes == pytest.approx(estimate.forward_backward_peak_bytes, rel=SUM_ORDER_RTOL)


def test_a_tied_layer_may_only_name_an_earlier_layer():
    from gbmw.errors import SpecError
    from gbmw.specs.model_spec import ModelSpec
    from gbmw.specs.schema import validate_as

    embedding = make_layer("embedding", kind="embedding", tied_to="head", tied_parameter_count=100)
    head = make_layer("head", kind="head")
    data = make_model([head]).model_dump() | {"layers": [embedding.model_dump(), head.model_dump()]}
    with pytest.raises(SpecError, match=r"layers\[0\] \(embedding\) is tied_to 'head', which does not come before it"):
        validate_as(ModelSpec, data, "model.yaml")
    assert np.array_equal(make_model([head]).is_block, [False])
