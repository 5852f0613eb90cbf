#!/usr/bin/env bash
# Mixtral 8x7B pre-training with Megatron-LM (Megatron-Core + Transformer Engine) on 8 nodes of 8 H100s: 8 experts
# spread over 8 GPUs (expert parallelism), tensor parallelism 2 with sequence parallelism, 4 pipeline stages.
# `distsim simulate --megatron-args @THIS --cluster dgx-h100 --nodes 8` predicts its iteration.
torchrun --nproc-per-node 8 --nnodes 8 pretrain_gpt.py \
    --use-mcore-models --transformer-impl transformer_engine \
    --num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 \
    --group-query-attention --num-query-groups 8 --seq-length 4096 --max-position-embeddings 32768 \
    --position-embedding-type rope --rotary-base 1000000 --normalization RMSNorm --swiglu \
    --untie-embeddings-and-output-weights --disable-bias-linear --attention-dropout 0.0 --hidden-dropout 0.0 \
    --tokenizer-type Llama2Tokenizer --tokenizer-model mistralai/Mixtral-8x7B-v0.1 \
    --num-experts 8 --moe-router-topk 2 --moe-grouped-gemm --moe-token-dispatcher-type alltoall \
    --moe-router-load-balancing-type aux_loss --moe-aux-loss-coeff 1e-2 \
    --expert-model-parallel-size 8 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 4 \
    --sequence-parallel --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather \
    --micro-batch-size 1 --global-batch-size 256 --bf16 \
    --lr 1e-4 --min-lr 1e-5 --lr-decay-style cosine --weight-decay 0.1 --clip-grad 1.0 \
    --train-iters 1000 --log-interval 1 --data-path /data/corpus_text_document --split 99,1,0 --save /checkpoints
