"""gbmw's hybrid runtime: runs any Plan on torch.distributed (paper Sec. 6), one technique per file.

groups (rank math, the process-group pool), tensor_parallel (megatron-core layers per layer group),
sharding (DP all-reduce, FSDP2 per layer), redistribute (Slice-Gather), pipeline (1F1B), tied_weights,
model (GPT/BERT layers), attention_core_recompute (+sel), experts (mixture-of-experts MLPs with expert
parallelism, +epN), grouped_experts (a rank's experts as grouped products), expert_sequence_parallel (MoE blocks
under +sp), expert_data_parallel (their gradients summed or ZeRO-sharded over the ranks holding the same
experts), ulysses (Ulysses sequence parallelism), context_parallel (ring attention, cp), engine (the train step),
checkpoint_files (plan-independent checkpoints), launch (device, backend, start-up) and train (`gbmw train`).
"""
