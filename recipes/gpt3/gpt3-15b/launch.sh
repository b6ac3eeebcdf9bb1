#!/usr/bin/env bash
# gpt3-15b on 4 nodes x 8 NVIDIA A100-SXM4-80GB with Megatron-DeepSpeed,
# as gbmw planned it (written by recipes/gpt3/regenerate.py). Set the variables below, here or in the
# environment, to paths every node sees; then run this script on the first node.
# Megatron-DeepSpeed gives DeepSpeed its own optimizer and learning-rate schedule, built from the flags:
# --optimizer ... --min-lr restate ds_config.json's `optimizer` and `scheduler` (which DeepSpeed ignores then).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

MEGATRON_DEEPSPEED_DIR="${MEGATRON_DEEPSPEED_DIR:-}"  # a checkout of https://github.com/microsoft/Megatron-DeepSpeed
DATA_PATH="${DATA_PATH:-}"                            # the prefix of tokenized data, a .bin/.idx pair (its tools/preprocess_data.py writes them)
VOCAB_FILE="${VOCAB_FILE:-}"                          # the GPT-2 BPE vocabulary (gpt2-vocab.json)
MERGE_FILE="${MERGE_FILE:-}"                          # the GPT-2 BPE merges (gpt2-merges.txt)
HOSTFILE="${HOSTFILE:-}"                              # DeepSpeed's hostfile, one line per node: HOST slots=8
CHECKPOINT_DIR="${CHECKPOINT_DIR:-}"                  # the folder checkpoints are saved to and resumed from
TRAIN_ITERS="${TRAIN_ITERS:-300000}"                  # iterations (of the global batch) to train: the schedule's total_num_steps
SAVE_INTERVAL="${SAVE_INTERVAL:-1000}"                # iterations between checkpoints
EVAL_INTERVAL="${EVAL_INTERVAL:-1000}"                # iterations between evaluations on the validation split

[[ -f "$MEGATRON_DEEPSPEED_DIR/pretrain_gpt.py" ]] || { echo "launch.sh: MEGATRON_DEEPSPEED_DIR ('$MEGATRON_DEEPSPEED_DIR') has no pretrain_gpt.py: set it to a checkout of https://github.com/microsoft/Megatron-DeepSpeed" >&2; exit 1; }
[[ -f "$DATA_PATH.bin" && -f "$DATA_PATH.idx" ]] || { echo "launch.sh: DATA_PATH ('$DATA_PATH') is not the prefix of a .bin and an .idx file: set it to the prefix of tokenized data, a .bin/.idx pair (its tools/preprocess_data.py writes them)" >&2; exit 1; }
[[ -f "$VOCAB_FILE" ]] || { echo "launch.sh: VOCAB_FILE ('$VOCAB_FILE') is not a file: set it to the GPT-2 BPE vocabulary (gpt2-vocab.json)" >&2; exit 1; }
[[ -f "$MERGE_FILE" ]] || { echo "launch.sh: MERGE_FILE ('$MERGE_FILE') is not a file: set it to the GPT-2 BPE merges (gpt2-merges.txt)" >&2; exit 1; }
[[ -f "$HOSTFILE" ]] || { echo "launch.sh: HOSTFILE ('$HOSTFILE') is not a file: set it to DeepSpeed's hostfile, one line per node: HOST slots=8" >&2; exit 1; }
[[ -n "$CHECKPOINT_DIR" ]] || { echo "launch.sh: CHECKPOINT_DIR ('$CHECKPOINT_DIR') is empty: set it to the folder checkpoints are saved to and resumed from" >&2; exit 1; }

deepspeed --hostfile "$HOSTFILE" --num_nodes 4 --num_gpus 8 "$MEGATRON_DEEPSPEED_DIR/pretrain_gpt.py" --tensor-model-parallel-size 1 --pipeline-model-parallel-size 2 --ds-sequence-parallel-size 2 --micro-batch-size 1 --global-batch-size 1024 --num-layers 48 --hidden-size 5120 --ffn-hidden-size 20480 --num-attention-heads 40 --seq-length 2048 --max-position-embeddings 2048 --bf16 --deepspeed --deepspeed_config "$HERE/ds_config.json" --zero-stage 1 --optimizer adam --adam-beta1 0.9 --adam-beta2 0.95 --adam-eps 1e-08 --weight-decay 0.1 --lr 0.0001 --lr-decay-style linear --lr-warmup-iters 2000 --lr-decay-iters 300000 --min-lr 0 --clip-grad 1 --log-interval 10 --data-path "$DATA_PATH" --split 949,50,1 --tokenizer-type GPT2BPETokenizer --vocab-file "$VOCAB_FILE" --merge-file "$MERGE_FILE" --train-iters "$TRAIN_ITERS" --save "$CHECKPOINT_DIR" --load "$CHECKPOINT_DIR" --save-interval "$SAVE_INTERVAL" --eval-interval "$EVAL_INTERVAL" --eval-iters 10
