"""The search: the outer loop over batch sizes, pipeline degrees and micro-batches (planner, Alg. 1), the stage DP
over layers × memory (stage_dp/, Eq. (4), Alg. 3), the exact whole-plan search (exact/), the bounds that let both
skip work without losing a plan (bounds/), pipeline partitions and the bi-objective adjustment (balance, Alg. 2),
and the "nothing fits" answer.

May import gbmw.cost, gbmw.space, gbmw.specs and the top-level contracts; never the command line or an adapter."""
