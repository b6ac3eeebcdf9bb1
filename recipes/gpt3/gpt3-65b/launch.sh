#!/usr/bin/env bash
# Add your data, tokenizer and vocabulary arguments at the end.
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CUDA_DEVICE_MAX_CONNECTIONS=1 deepspeed --hostfile hostfile --num_nodes 4 --num_gpus 8 pretrain_gpt.py --tensor-model-parallel-size 2 --pipeline-model-parallel-size 8 --micro-batch-size 1 --global-batch-size 1792 --num-layers 80 --hidden-size 8192 --ffn-hidden-size 32768 --num-attention-heads 64 --seq-length 2048 --max-position-embeddings 2048 --bf16 --sequence-parallel --recompute-granularity selective --deepspeed --deepspeed_config "$HERE/ds_config.json" --zero-stage 1
