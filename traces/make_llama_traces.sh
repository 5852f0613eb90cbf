#!/usr/bin/env bash
# Records the Llama-style traces of the validation matrix: llama-cpu (grouped-query attention with 2 key/value heads
# of 8, SwiGLU, RMSNorm, rotary positions, untied output layer, no biases; CPU-sized, fp32), 4 traces
# (make_model_traces.sh says which).
exec bash "$(dirname "$0")/make_model_traces.sh" llama-cpu
