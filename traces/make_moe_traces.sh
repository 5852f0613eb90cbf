#!/usr/bin/env bash
# Records the mixture-of-experts traces of the validation matrix: moe-cpu (Mixtral-style layers of 4 experts, top-2,
# each expert on every rank; otherwise llama-cpu's layers; CPU-sized, fp32), 4 traces (make_model_traces.sh says
# which).
exec bash "$(dirname "$0")/make_model_traces.sh" moe-cpu
