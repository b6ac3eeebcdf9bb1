"""gbmw's own plans on one GPU (issue 28: "`gbmw validate` on gbmw's own plans, scaled to one GPU, is the check"):
for each case a model of a few blocks, the H100 recipe reduced to one device, `gbmw plan` picks the plan (its
micro-batches and per-layer recomputation, at the job's batch), then `gbmw validate` trains that plan with the
runtime and prints estimated against measured step time and peak memory (torch.cuda.max_memory_allocated). Both
are the command lines a user runs; this script only writes the job files and collects the two JSON outputs.

Usage, on a machine with a CUDA GPU and gbmw installed:
    python benchmarks/gpu_own_plans.py recipes OUT_DIR [CASE ...]
    python benchmarks/gpu_own_plans.py recipes OUT_DIR --smoke      # tiny cases on this CPU (checks the script)
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml
from one_device_plans import GPT, LLAMA

CASES = {  # name: (model fields, blocks, global batch) — the plan is gbmw's
    "gpt-h5120-L12-b16": (dict(GPT, hidden_size=5120, num_heads=40), 12, 16),
    "llama-h4096-L8-b16": (dict(LLAMA, hidden_size=4096, num_heads=32, num_kv_heads=8, ffn_hidden_size=14336), 8, 16),
    "moe8-h4096-L2-b16": (dict(LLAMA, hidden_size=4096, num_heads=32, num_kv_heads=8, ffn_hidden_size=14336,
                               moe=dict(num_experts=8, top_k=2, expert_ffn_hidden_size=14336)), 2, 16),
    "moe64-h2048-L4-b16": (dict(LLAMA, hidden_size=2048, num_heads=16, num_kv_heads=4, ffn_hidden_size=768,
                                moe=dict(num_experts=64, top_k=8, expert_ffn_hidden_size=768)), 4, 16),
}
SMOKE = {  # the same kinds, tiny, fp32 on this machine's CPU
    "gpt-smoke": (dict(GPT, seq_length=64, vocab_size=256, hidden_size=64, num_heads=4), 2, 4),
    "moe-smoke": (dict(LLAMA, seq_length=64, vocab_size=256, hidden_size=64, num_heads=4, num_kv_heads=2,
                       ffn_hidden_size=96, moe=dict(num_experts=4, top_k=2, expert_ffn_hidden_size=96)), 2, 4),
}


def one_device_cluster(recipes: Path, out: Path, recipe: str) -> Path:
    """A cluster recipe reduced to one device (as benchmarks/one_device_plans.py does the H100's)."""
    cluster = yaml.safe_load((recipes / "clusters" / f"{recipe}.yaml").read_text())
    cluster.update(name=f"{recipe}-as-x1", nodes=1, devices_per_node=1)
    cluster["links"] = [dict(cluster["links"][0], devices=1)]
    path = out / f"{recipe}-as-x1.yaml"
    path.write_text(yaml.safe_dump(cluster))
    return path


def gbmw(*arguments: str) -> None:
    print("$ gbmw", " ".join(arguments), flush=True)
    subprocess.run([sys.executable, "-m", "gbmw", *arguments], check=True)


def main() -> int:
    recipes, out = Path(sys.argv[1]), Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    smoke = "--smoke" in sys.argv
    cases = SMOKE if smoke else CASES
    chosen = [name for name in sys.argv[3:] if not name.startswith("--")] or list(cases)
    cluster = str(one_device_cluster(recipes, out, "cpu-x4" if smoke else "h100-80g-x64"))
    rows = []
    for name in chosen:
        fields, blocks, batch = cases[name]
        (out / f"{name}.yaml").write_text(yaml.safe_dump(dict(fields, name=name, num_layers=blocks)))
        job = out / f"job-{name}.yaml"
        job.write_text(yaml.safe_dump(dict(model=str(out / f"{name}.yaml"), cluster=cluster,
                                           precision="fp32" if smoke else "bf16", optimizer="adam",
                                           global_batch=batch, **({"memory_budget": "64MiB"} if smoke else {}))))
        plan = out / f"plan-{name}.yaml"
        gbmw("plan", str(job), "-o", str(plan))
        result = out / f"validate-{name}.json"
        gbmw("validate", str(job), "--plans", str(plan), "--one-at-a-time", "--steps", "5", "--warmup", "2",
             "--json", str(result))
        rows.append(dict(case=name, plan=yaml.safe_load(plan.read_text()), validate=json.loads(result.read_text())))
    (out / "own-plans.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
