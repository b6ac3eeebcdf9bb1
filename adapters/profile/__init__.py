"""Measurement on real hardware for `gbmw profile` (needs torch): one technique per file.

`gbmw profile cluster` (cluster_profiler.py): collective_timing.py, link_fit.py (pure, no torch), overlap.py
and cluster_yaml.py (pure, no torch). `gbmw profile model` (model_profiler.py): layer_timers.py,
pair_timers.py, optimizer_step_timer.py and layer_measurement.py. Shared: timing.py (fast-quarter means),
activations.py and held_memory.py (saved tensors). `gbmw validate`: validate.py.
"""
