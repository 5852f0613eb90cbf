#!/usr/bin/env bash
# Llama 3 70B pre-training with Megatron-LM (Megatron-Core + Transformer Engine), FP8 on 8 nodes of 8 H100s, laid
# out as NVIDIA's Megatron-LM examples and performance recipes launch it. `distsim simulate --megatron-args @THIS
# --cluster dgx-h100 --nodes 8` predicts its iteration; the data paths and the tokenizer need not exist for that.
torchrun --nproc-per-node 8 --nnodes 8 pretrain_gpt.py \
    --use-mcore-models --transformer-impl transformer_engine \
    --num-layers 80 --hidden-size 8192 --ffn-hidden-size 28672 --num-attention-heads 64 \
    --group-query-attention --num-query-groups 8 --kv-channels 128 \
    --seq-length 8192 --max-position-embeddings 8192 \
    --position-embedding-type rope --rotary-base 500000 --normalization RMSNorm --norm-epsilon 1e-5 \
    --swiglu --untie-embeddings-and-output-weights --disable-bias-linear \
    --attention-dropout 0.0 --hidden-dropout 0.0 \
    --tokenizer-type HuggingFaceTokenizer --tokenizer-model meta-llama/Meta-Llama-3-70B \
    --micro-batch-size 1 --global-batch-size 128 \
    --tensor-model-parallel-size 8 --pipeline-model-parallel-size 4 --num-layers-per-virtual-pipeline-stage 5 \
    --sequence-parallel --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather --tp-comm-overlap \
    --bf16 --fp8-format hybrid --fp8-amax-history-len 1024 --fp8-amax-compute-algo max \
    --lr 1.5e-4 --min-lr 1.5e-5 --lr-decay-style cosine --weight-decay 0.1 --clip-grad 1.0 \
    --train-iters 1000 --log-interval 1 --data-path /data/corpus_text_document --split 99,1,0 --save /checkpoints
