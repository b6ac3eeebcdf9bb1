"""The runtime's 1F1B schedule holds exactly as many micro-batches in flight as the estimator charges memory for."""

import pytest

from gbmw.cost.pipeline_schedules import in_flight_micro_batches

pytestmark = pytest.mark.torch


@pytest.mark.parametrize("stages", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("micro_batches", [1, 2, 3, 5, 8, 16])
def test_peak_in_flight_is_what_the_estimator_charges(stages, micro_batches):
    pytest.importorskip("torch")
    from gbmw.adapters.runtime.pipeline import one_f_one_b

    for stage in range(stages):
        order = list(one_f_one_b(stage, stages, micro_batches))
        assert sorted(order) == sorted([("forward", i) for i in range(micro_batches)]
                                       + [("backward", i) for i in range(micro_batches)])
        in_flight = peak = 0
        for kind, _ in order:
            in_flight += 1 if kind == "forward" else -1
            peak = max(peak, in_flight)
        assert peak == in_flight_micro_batches("1f1b", stage, stages, micro_batches)
