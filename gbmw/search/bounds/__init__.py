"""Bounds the search prunes with, each with its proof and float margin: a setting's throughput ceiling and
no-partition-fits test (setting_bounds), a stage's least boundary send (stage_boundary_floor), the knapsack bound on
a stage's best time under memory (stage_knapsack_bound), and completion bounds for partial stages (stage_suffix_bound,
stage_segment_bound). A bound that is not exact loses plans: tests compare each with the brute force's frontier."""
