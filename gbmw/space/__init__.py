"""The strategy space: per-layer Strategy and the decision trees that enumerate it (paper Sec. 3, Takeaways #1–#3),
the search spaces (the paper's variants and fixed baselines), the targets (what each framework can run: its axes,
partition rules and techniques), and the stock frameworks' partition rules.

May import gbmw.specs and gbmw.errors; never the Plan contract above it (a target checks any plan-shaped object,
gbmw.space.targets.PlanLayout), the cost model or the search."""
