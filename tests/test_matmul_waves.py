"""Tile and wave quantization of matmuls (gbmw.cost.matmul_waves), by hand, and as layer_cost charges it."""

import numpy as np
import pytest
from conftest import make_cluster, make_layer, make_model

from gbmw.cost.comm import CommModel
from gbmw.cost.layer_cost import CostSettings
from gbmw.cost.layer_cost_batch import layer_costs
from gbmw.cost.matmul_waves import linear_wave_loss_s, matmul_time_s, wave_efficiency
from gbmw.space.strategy import Strategy
from gbmw.specs.cluster_spec import ClusterSpec
from gbmw.specs.model_spec import Matmul

pytestmark = pytest.mark.unit


def test_wave_efficiency_by_hand():
    # 256 x 1280 on 72 SMs: 2 x 10 = 20 tiles of 128 x 128, one wave of 72 tiles: 20/72 of the rate.
    assert wave_efficiency(256, 1280, 72) == pytest.approx(20 / 72)
    # 197 rows still take 2 tile rows: 197 * 1280 / (72 * 128 * 128).
    assert wave_efficiency(197, 1280, 72) == pytest.approx(197 * 1280 / (72 * 128 * 128))
    # 73 full tiles: two waves, the second holding one tile.
    assert wave_efficiency(128, 73 * 128, 72) == pytest.approx(73 / 144)
    # Whole waves of whole tiles run at the full rate; an empty output costs nothing (padding).
    assert wave_efficiency(128 * 8, 128 * 9, 72) == 1.0
    assert wave_efficiency(0, 1280, 72) == 1.0


def test_matmul_time_is_flops_over_rate_over_efficiency():
    # 1024^3 on 64 SMs: 64 tiles, one full wave: 2 * 1024^3 FLOPs at 1 TFLOP/s.
    assert matmul_time_s(1024, 1024, 1024, 1e12, 64) == pytest.approx(2 * 1024**3 / 1e12)
    # Half the rows: half the tiles in one wave, half the FLOPs: the same time.
    assert matmul_time_s(512, 1024, 1024, 1e12, 64) == pytest.approx(2 * 1024**3 / 1e12)


def test_linear_wave_loss_forward_and_backward_by_hand():
    # rows 128, out 256, in 512, 4 SMs at 1 TFLOP/s. Forward output 128 x 256: 2 tiles of 4 -> 1/2 rate.
    # Backward: input gradient 128 x 512 (4 tiles, full), weight gradient 512 x 256 (8 tiles, 2 full waves).
    flops = 2 * 128 * 256 * 512
    forward, backward = linear_wave_loss_s(np.array([[128.0]]), np.array([[256.0]]), np.array([[512.0]]), 1e12, 4)
    assert forward[0] == pytest.approx(flops / 1e12)  # twice the time: the loss equals the full-rate time
    assert backward[0] == pytest.approx(0.0, abs=1e-18)
    # Padding (zero rows) loses nothing.
    forward, backward = linear_wave_loss_s(np.zeros((1, 2)), np.full((1, 2), 256.0), np.full((1, 2), 512.0), 1e12, 4)
    assert forward[0] == 0.0 and backward[0] == 0.0


def _cluster_with(multiprocessors: int | None) -> ClusterSpec:
    data = make_cluster().model_dump()
    data["device"]["multiprocessors"] = multiprocessors
    return ClusterSpec.model_validate(data)


def test_layer_cost_adds_the_wave_loss_of_its_tp_split_matmuls():
    # One column-parallel matmul per sample: 64 rows, 1024 out, 2048 in; its FLOPs are forward_flops_per_sample.
    matmul = Matmul(rows_per_sample=64, out_features=1024, in_features=2048, tp_split="out")
    flops = 2 * 64 * 1024 * 2048
    layer = make_layer(forward_flops_per_sample=flops, matmuls=(matmul,), tp_allreduce_bytes_per_sample=0.0)
    model = make_model([layer])
    plain, waves = _cluster_with(None), _cluster_with(16)

    def cost(cluster, name, micro_batch):
        return layer_costs(model, Strategy.parse(name), micro_batch, CostSettings(cluster, "fp32"), CommModel(cluster))

    # tp8 over 2 samples at 1 TFLOP/s: the forward output is 128 x 128 per device, one tile of a 16-SM wave: 1/16
    # of the rate, so it loses 15 times its full-rate time. Backward fills whole waves: the input gradient
    # 128 x 2048 and the weight gradient 2048 x 128 are 16 tiles each, and lose nothing.
    full = flops * 2 / 8 / 1e12
    for field in ("time_s", "time_no_grad_sync_s"):
        assert getattr(cost(waves, "tp8", 2), field)[0] - getattr(cost(plain, "tp8", 2), field)[0] == (
            pytest.approx(15 * full))
    # A checkpointed layer pays the forward's loss again in its recomputation.
    assert cost(waves, "tp8+ckpt", 2).time_s[0] - cost(plain, "tp8+ckpt", 2).time_s[0] == pytest.approx(30 * full)
    # 256 samples fill whole waves everywhere (forward 16384 x 128: 128 tiles): nothing lost.
    assert cost(waves, "tp8", 256).time_s[0] == pytest.approx(cost(plain, "tp8", 256).time_s[0])
    # A row-parallel matmul splits its input features instead: tp8 over 2 samples, 128 x 1024 output (8 tiles, 1/2).
    row_parallel = make_model([make_layer(forward_flops_per_sample=flops, tp_allreduce_bytes_per_sample=0.0,
                                          matmuls=(matmul.model_copy(update={"tp_split": "in"}),))])
    settings = CostSettings(waves, "fp32")
    lost = (layer_costs(row_parallel, Strategy.parse("tp8"), 2, settings, CommModel(waves)).time_no_grad_sync_s[0]
            - cost(plain, "tp8", 2).time_no_grad_sync_s[0])
    # forward 128 x 1024: 8 tiles -> 2x; input gradient 128 x 256: 2 tiles -> 8x; weight gradient 256 x 1024: 16 tiles
    assert lost == pytest.approx(full + 7 * full)
