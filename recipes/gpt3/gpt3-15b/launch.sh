#!/usr/bin/env bash
# Add your data, tokenizer and vocabulary arguments at the end.
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
deepspeed --hostfile hostfile --num_nodes 4 --num_gpus 8 pretrain_gpt.py --tensor-model-parallel-size 1 --pipeline-model-parallel-size 2 --ds-sequence-parallel-size 2 --micro-batch-size 1 --global-batch-size 1024 --num-layers 48 --hidden-size 5120 --ffn-hidden-size 20480 --num-attention-heads 40 --seq-length 2048 --max-position-embeddings 2048 --bf16 --deepspeed --deepspeed_config "$HERE/ds_config.json" --zero-stage 1
