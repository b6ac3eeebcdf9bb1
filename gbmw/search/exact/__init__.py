"""The exact search (`--exact`): every stage's non-dominated partial plans over whole pipelines, with exact memory,
pruned only by the proven bounds of gbmw.search.bounds, so it equals a brute force over whole plans."""
