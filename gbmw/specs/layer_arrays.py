"""A model's layer fields as numpy arrays, one entry per layer, for the vectorised cost model
(gbmw.specs.model_spec.ModelSpec.arrays)."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np


class LayerArrays:
    """The layer fields of a ModelSpec as numpy arrays (one entry per layer) for vectorised costing; a timing a
    layer lacks reads as 0 (`has_measured_time` / `has_measured_backward` say which layers have them)."""

    def __init__(self, layers: Sequence[Any]):
        """`layers`: a ModelSpec's LayerSpecs."""
        def column(field: str) -> np.ndarray:
            return np.array([float(getattr(layer, field) or 0.0) for layer in layers])

        def timing(field: str) -> np.ndarray:
            return np.array([float(getattr(layer.timings, field, None) or 0.0) for layer in layers])

        self.parameter_count = column("parameter_count")
        self.tp_split_parameter_count = column("tp_split_parameter_count")
        self.forward_flops_per_sample = column("forward_flops_per_sample")
        self.tp_replicated_forward_flops_per_sample = column("tp_replicated_forward_flops_per_sample")
        self.boundary_activation_bytes_per_sample = column("boundary_activation_bytes_per_sample")
        self.intermediate_activation_bytes_per_sample = column("intermediate_activation_bytes_per_sample")
        self.intermediate_tp_split_activation_bytes_per_sample = column(
            "intermediate_tp_split_activation_bytes_per_sample"
        )
        self.side_input_bytes_per_sample = column("side_input_bytes_per_sample")
        self.tied_parameter_count = column("tied_parameter_count")
        self.tp_allreduce_bytes_per_sample = column("tp_allreduce_bytes_per_sample")
        self.attention_query_bytes_per_sample = column("attention_query_bytes_per_sample")
        self.attention_key_value_bytes_per_sample = column("attention_key_value_bytes_per_sample")
        self.num_experts = column("num_experts")
        self.expert_parameter_count = column("expert_parameter_count")
        self.expert_forward_flops_per_sample = column("expert_forward_flops_per_sample")
        self.expert_dispatch_bytes_per_sample = column("expert_dispatch_bytes_per_sample")
        self.expert_activation_bytes_per_sample = column("expert_activation_bytes_per_sample")
        self.expert_tp_split_activation_bytes_per_sample = column("expert_tp_split_activation_bytes_per_sample")
        self.expert_load_factor = column("expert_load_factor")
        self.backward_workspace_tp_split_bytes_per_sample = column("backward_workspace_tp_split_bytes_per_sample")
        self.largest_weight_gradient_tp_split_bytes = column("largest_weight_gradient_tp_split_bytes")
        self.expert_largest_weight_gradient_bytes = column("expert_largest_weight_gradient_bytes")
        self.loss_logits_per_sample = column("loss_logits_per_sample")
        self.gated_activation_elements_per_sample = column("gated_activation_elements_per_sample")
        self.residual_input_bytes_per_sample = column("residual_input_bytes_per_sample")
        self.expert_gated_activation_elements_per_sample = column("expert_gated_activation_elements_per_sample")
        self.expert_input_activation_bytes_per_sample = column("expert_input_activation_bytes_per_sample")
        self.rms_norm_elements_per_sample = column("rms_norm_elements_per_sample")
        self.rotary_elements_per_sample = column("rotary_elements_per_sample")
        self.forward_flash_attention_flops_per_sample = column("forward_flash_attention_flops_per_sample")
        self.flash_attention_skipped_flops_per_sample = column("flash_attention_skipped_flops_per_sample")
        # what a flash kernel runs: the core's FLOPs less the tiles a causal mask skips
        self.flash_kernel_flops_per_sample = (self.forward_flash_attention_flops_per_sample
                                              - self.flash_attention_skipped_flops_per_sample)
        self.fp8_forward_flops_per_sample = column("fp8_forward_flops_per_sample")
        self.fp8_parameter_count = column("fp8_parameter_count")
        self.fp8_tp_replicated_parameter_count = column("fp8_tp_replicated_parameter_count")
        self.fp8_forward_cast_traffic_bytes_per_sample = column("fp8_forward_cast_traffic_bytes_per_sample")
        self.fp8_backward_cast_traffic_bytes_per_sample = column("fp8_backward_cast_traffic_bytes_per_sample")
        self.fp8_norm_cast_elements_per_sample = column("fp8_norm_cast_elements_per_sample")
        self.forward_memory_traffic_bytes_per_sample = column("forward_memory_traffic_bytes_per_sample")
        self.attention_core_activation_bytes_per_sample = column("attention_core_activation_bytes_per_sample")
        self.attention_core_flops_per_sample = column("attention_core_flops_per_sample")
        self.attention_core_memory_traffic_bytes_per_sample = column("attention_core_memory_traffic_bytes_per_sample")
        self.forward_tp_split_memory_traffic_bytes_per_sample = column("forward_tp_split_memory_traffic_bytes_per_sample")
        self.has_measured_time = np.array([layer.timings is not None for layer in layers])
        # [layer, matmul]: the layers' linear matmuls, padded with zero-sized ones
        width = max([len(layer.matmuls) for layer in layers] + [1])
        shapes = np.zeros((len(layers), width, 5))
        for row, layer in enumerate(layers):
            for index, matmul in enumerate(layer.matmuls):
                shapes[row, index] = (matmul.rows_per_sample, matmul.out_features, matmul.in_features,
                                      matmul.tp_split == "out", matmul.tp_split == "none")
        self.matmul_rows_per_sample, self.matmul_out_features, self.matmul_in_features = (
            shapes[..., 0], shapes[..., 1], shapes[..., 2])
        self.matmul_splits_out = shapes[..., 3].astype(bool)
        self.matmul_replicated = shapes[..., 4].astype(bool)
        """Whole on every TP rank (`Matmul.tp_split` none)."""
        self.forward_time_per_sample_s = timing("forward_time_per_sample_s")
        self.has_measured_backward = np.array(
            [layer.timings is not None and layer.timings.backward_time_per_sample_s is not None for layer in layers]
        )
        self.backward_time_per_sample_s = timing("backward_time_per_sample_s")
        self.forward_overhead_s = timing("forward_overhead_s")
        self.backward_overhead_s = timing("backward_overhead_s")
        self.profiled_batch = timing("profiled_batch")
        self.tp2_time_s = timing("tp2_time_s")
        self.tp2_forward_time_s = timing("tp2_forward_time_s")
        self.sdp2_time_s = timing("sdp2_time_s")
        self.ckpt_time_s = timing("ckpt_time_s")
        names = [layer.name for layer in layers]
        self.tied_to_index = np.array(
            [names.index(layer.tied_to) if layer.tied_to is not None else -1 for layer in layers]
        )
