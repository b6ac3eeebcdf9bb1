"""Specs: what gbmw is asked about — the model (architectures, their analytic layer costs, HF config.json import), the
cluster (devices, memory, links) and the job (batch, sequence, precision, budget) — read from files safely (bounded,
YAML safe-loaded, written atomically) and validated into typed, frozen specs.

The bottom of the planner: it imports only gbmw.errors (and numpy, pyyaml, pydantic); every other part reads it."""
