"""The estimator: per-layer time and memory of each strategy (compute, communication over the link levels its groups
span, model states per framework, stashed and recomputed activations), the transition cost R between layouts, stage
costs and the pipeline's iteration time (paper Sec. 5, Eq. (1)–(4), (9), Appendix C), and `estimate_plan`.

May import gbmw.specs, gbmw.space and the top-level contracts (gbmw.plan, gbmw.ranks, gbmw.errors); never the
search or the command line."""
