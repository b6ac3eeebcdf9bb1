"""Plans a person writes instead of searching: a uniform Megatron/DeepSpeed-style 3D configuration (`--uniform
tp=8,pp=2,…`: uniform_config) and the published hand-tuned configurations of recipes/handtuned/ (handtuned_config),
costed by the same estimator as the planner's plans.

May import gbmw.plan, gbmw.space, gbmw.specs; never the cost model, the search or the command line."""
