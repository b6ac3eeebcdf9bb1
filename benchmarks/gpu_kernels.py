"""Kernel measurements on one CUDA GPU for the cost model's device facts (issue 28: devices come from kernel
measurements, never from training runs): bf16 matmuls at the shapes gbmw's plans run (dense layers at TP 1–8,
the experts of the MoE models gbmw costs) against gbmw's wave model (gbmw.cost.matmul_waves); an MoE layer's
experts run one by one, as torch's grouped matmul, and as one matmul of all their tokens; fused attention
(torch's SDPA, flash and cuDNN back ends) causal and not, forward and forward+backward, as gbmw's
"full-square" rate (4·b·h·s²·d FLOPs forward, 3× that forward+backward — what gbmw charges); FP8 GEMMs
(torch._scaled_mm, per-tensor scales) and the bf16 → FP8 cast; the device-to-device copy bandwidth.

Usage, on a machine with a CUDA GPU: python benchmarks/gpu_kernels.py OUT_DIR [SECTION,...]
Sections: copy, matmul, experts, attention, fp8 (all by default), expert_matmul (matmul's expert shapes alone). Each time is the median of CUDA-event timings
after warm-up (GBMW_CUDA_GRAPHS=1: of CUDA-graph replays, for calls shorter than their launch); each row prints
as it is measured and all rows are written to OUT_DIR/gpu_kernels.json.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from gbmw.cost.matmul_waves import matmul_time_s

BF16_MATMUL_FLOPS_PER_S = 797.5e12  # recipes/clusters/h100-80g-x64.yaml sustained_tflops.bf16 (8192³ torch.matmul)


def median_time_s(run, repeats: int = 20, warmup: int = 5) -> float:
    """Median seconds of one call of `run`: each call between two CUDA events, or, with GBMW_CUDA_GRAPHS=1, 20
    calls captured in one CUDA graph and replayed (the GPU's time alone: a call shorter than Python's launch of
    it is otherwise timed at the launch rate)."""
    if os.environ.get("GBMW_CUDA_GRAPHS") == "1":
        return _graph_time_s(run, repeats)
    return _event_time_s(run, repeats, warmup)


def _graph_time_s(run, repeats: int, calls: int = 20) -> float:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            run()
    return _event_time_s(graph.replay, repeats, 2) / calls


def _event_time_s(run, repeats: int, warmup: int) -> float:
    for _ in range(warmup):
        run()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def report(measured: list, section: str, **row) -> None:
    row = dict(section=section, **row)
    measured.append(row)
    print(json.dumps(row), flush=True)


def copy_bandwidth(rows: list) -> None:
    source = torch.empty(2**30, dtype=torch.uint8, device="cuda")
    target = torch.empty_like(source)
    seconds = median_time_s(lambda: target.copy_(source))
    report(rows, "copy", bytes=2**30, time_s=seconds, read_plus_write_gb_per_s=2 * 2**30 / seconds / 1e9)


def matmul_rates(rows: list, layer_shapes: bool = True) -> None:
    shapes = [("square", 8192, 8192, 8192)]
    for tokens in (2048, 4096, 8192) if layer_shapes else ():  # micro-batch tokens: GPT-3 13B/175B widths at TP 1, 2, 4, 8
        for hidden in (5120, 12288):
            for tp in (1, 2, 4, 8):
                shapes += [(f"h{hidden}-tp{tp}-qkv", tokens, 3 * hidden // tp, hidden),
                           (f"h{hidden}-tp{tp}-fc1", tokens, 4 * hidden // tp, hidden),
                           (f"h{hidden}-tp{tp}-fc2", tokens, hidden, 4 * hidden // tp)]
    for name, hidden, ffn in EXPERT_MODELS:
        for tokens in (128, 512, 1024, 2048, 4096, 8192):
            shapes += [(f"{name}-expert-fc1", tokens, 2 * ffn, hidden), (f"{name}-expert-fc2", tokens, hidden, ffn)]
    for name, m, n, k in shapes:
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        seconds = median_time_s(lambda: a @ b)
        modelled = float(matmul_time_s(m, n, k, BF16_MATMUL_FLOPS_PER_S, 132))
        report(rows, "matmul", shape=name, rows=m, columns=n, inner=k, time_s=seconds,
               tflops=2 * m * n * k / seconds / 1e12, wave_model_s=modelled, measured_over_model=seconds / modelled)


# (name, hidden, expert FFN width) of the MoE models costed in benchmarks/published_moe_runs.yaml; gated experts
EXPERT_MODELS = [("gptoss", 2880, 2880), ("qwen3-30b", 2048, 768), ("mixtral-8x7b", 4096, 14336),
                 ("deepseek-v3", 7168, 2048), ("qwen3-235b", 4096, 1536)]


def expert_layers(rows: list) -> None:
    """One MoE layer's local experts (fc1, gated, then fc2) on `tokens` routed token-rows spread evenly."""
    grouped = getattr(torch, "_grouped_mm", None)
    for name, hidden, ffn in EXPERT_MODELS:
        for experts, routed_rows in ((4, 16384), (8, 16384), (16, 16384), (32, 32768), (8, 65536)):
            per_expert = routed_rows // experts
            x = torch.randn(routed_rows, hidden, device="cuda", dtype=torch.bfloat16)
            w1 = torch.randn(experts, hidden, 2 * ffn, device="cuda", dtype=torch.bfloat16)
            w2 = torch.randn(experts, ffn, hidden, device="cuda", dtype=torch.bfloat16)
            flops = 2 * routed_rows * hidden * 3 * ffn

            def one_by_one():
                for e in range(experts):
                    part = x[e * per_expert:(e + 1) * per_expert]
                    a, g = (part @ w1[e]).chunk(2, dim=-1)
                    _ = (F.silu(a) * g) @ w2[e]

            def one_matmul():  # every routed row through one expert's weights: the dense-rate bound
                a, g = (x @ w1[0]).chunk(2, dim=-1)
                _ = (F.silu(a) * g) @ w2[0]

            times = dict(loop=median_time_s(one_by_one), one_matmul=median_time_s(one_matmul))
            if grouped is not None:
                offsets = torch.arange(1, experts + 1, device="cuda", dtype=torch.int32) * per_expert

                def grouped_run():
                    h = grouped(x, w1, offs=offsets)
                    a, g = h.chunk(2, dim=-1)
                    _ = grouped((F.silu(a) * g).contiguous(), w2, offs=offsets)
                try:
                    times["grouped_mm"] = median_time_s(grouped_run)
                except Exception as failure:  # noqa: BLE001 - report and go on
                    times["grouped_mm_error"] = repr(failure)[:200]
            report(rows, "experts", model=name, local_experts=experts, routed_rows=routed_rows,
                   rows_per_expert=per_expert, **{f"{k}_s": v for k, v in times.items() if isinstance(v, float)},
                   **{f"{k}_tflops": flops / v / 1e12 for k, v in times.items() if isinstance(v, float)},
                   **{k: v for k, v in times.items() if isinstance(v, str)})
            del x, w1, w2


def attention_rates(rows: list) -> None:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}
    for heads, head_dim in ((32, 128), (64, 64)):
        for seq in (2048, 4096, 8192, 16384, 32768):
            batch = max(1, 16384 // seq)
            q, k, v = (torch.randn(batch, heads, seq, head_dim, device="cuda", dtype=torch.bfloat16,
                                   requires_grad=True) for _ in range(3))
            grad = torch.randn(batch, heads, seq, head_dim, device="cuda", dtype=torch.bfloat16)
            square_flops = 4 * batch * heads * seq * seq * head_dim
            for backend_name, backend in backends.items():
                for causal in (False, True):
                    def forward():
                        with sdpa_kernel(backend):
                            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

                    def forward_backward():
                        out = forward()
                        torch.autograd.grad(out, (q, k, v), grad)
                    try:
                        fwd = median_time_s(forward, repeats=10)
                        both = median_time_s(forward_backward, repeats=10)
                    except Exception as failure:  # noqa: BLE001 - a back end this build lacks
                        report(rows, "attention", backend=backend_name, causal=causal, seq=seq, heads=heads,
                               head_dim=head_dim, error=repr(failure)[:200])
                        continue
                    report(rows, "attention", backend=backend_name, causal=causal, seq=seq, batch=batch, heads=heads,
                           head_dim=head_dim, forward_s=fwd, forward_backward_s=both,
                           square_forward_tflops=square_flops / fwd / 1e12,
                           square_forward_backward_tflops=3 * square_flops / both / 1e12)
            del q, k, v, grad


def fp8_rates(rows: list) -> None:
    scaled_mm = getattr(torch, "_scaled_mm", None)
    shapes = [("square", 8192, 8192, 8192), ("square-4k", 4096, 4096, 4096), ("square-16k", 16384, 16384, 16384)]
    for hidden in (5120, 12288):
        for tp in (1, 8):
            shapes += [(f"h{hidden}-tp{tp}-fc1", 8192, 4 * hidden // tp, hidden),
                       (f"h{hidden}-tp{tp}-fc2", 8192, hidden, 4 * hidden // tp)]
    one = torch.ones((), device="cuda", dtype=torch.float32)
    for name, m, n, k in shapes:
        a16 = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b16 = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        a8, b8 = a16.to(torch.float8_e4m3fn), b16.to(torch.float8_e4m3fn)
        bf16_s = median_time_s(lambda: a16 @ b16.t())
        try:
            fp8_s = median_time_s(lambda: scaled_mm(a8, b8.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16))
        except Exception as failure:  # noqa: BLE001
            report(rows, "fp8", shape=name, error=repr(failure)[:200])
            continue
        cast_s = median_time_s(lambda: a16.to(torch.float8_e4m3fn))
        amax_s = median_time_s(lambda: a16.abs().amax())
        report(rows, "fp8", shape=name, rows=m, columns=n, inner=k, fp8_s=fp8_s, bf16_s=bf16_s,
               fp8_tflops=2 * m * n * k / fp8_s / 1e12, bf16_tflops=2 * m * n * k / bf16_s / 1e12,
               input_cast_s=cast_s, input_amax_s=amax_s, input_bytes_bf16=2 * m * k)


SECTIONS = dict(copy=copy_bandwidth, matmul=matmul_rates, experts=expert_layers, attention=attention_rates,
                fp8=fp8_rates, expert_matmul=lambda rows: matmul_rates(rows, layer_shapes=False))

if __name__ == "__main__":
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    chosen = sys.argv[2].split(",") if len(sys.argv) > 2 else list(SECTIONS)
    print("device", torch.cuda.get_device_name(), "torch", torch.__version__, "cuda", torch.version.cuda,
          "cudnn", torch.backends.cudnn.version(), flush=True)
    measured: list = []
    for section in chosen:
        try:
            SECTIONS[section](measured)
        except Exception as failure:  # noqa: BLE001 - keep what the other sections measure
            report(measured, section, error=repr(failure)[:300])
        torch.cuda.empty_cache()
        (out / "gpu_kernels.json").write_text(json.dumps(measured, indent=1))
