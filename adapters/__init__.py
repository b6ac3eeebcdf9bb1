"""Realisations of a Plan: DeepSpeed configs, Megatron arguments and the hybrid runtime.

Installed as `gbmw.adapters` (the top-level name `adapters` belongs to a PyPI library).
"""
