"""The stage DP (Eq. (4), Algorithm 3): the best strategy per layer of one pipeline stage under its memory budget, on
a memory grid (grid_frontier, numba) or on exact Pareto frontiers (pareto), with each layer's candidate options
(layer_options) and the optimizer step's reserve (step_reserve_search)."""
