#!/usr/bin/env bash
# Issue 31 item 2 on the GPU (prepared in session 9, not run yet): softcap, sliding windows and sinks compiled.
#   EACH_TIMEOUT=560 bash scripts/gpu/run_all.sh features31
#   1. the features' cuda tests against the fp64 oracle (dense and decode on the Triton programs, and the varlen
#      Gluon program named explicitly, bf16; ~30 Gluon compiles)                                             (<= 240 s)
#   2. benchmarks/kernel_features_bench.py: each feature's GPU time against the plain call, default and Gluon (<= 150 s)
#   3. verify --model on a Gemma 2-shaped config with the kernel, default (the varlen Gluon program since session 10)
#      and FLASH_TRITON_GLUON_FEATURES=0 (the Triton program)                                              (the rest)
set -u
dest="${OUT:-/tmp/out}/features31"; mkdir -p "$dest"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
t0=$(date +%s)
FLASH_TRITON_CHECK_LAUNCH=1 timeout 240 python3 -m pytest -q -m cuda -p no:cacheprovider tests/test_kernel_features.py \
  > "$dest/cuda-tests.log" 2>&1
echo "cuda tests exit=$? at $(( $(date +%s) - t0 ))s"; grep -E "passed|failed|FAILED|Error" "$dest/cuda-tests.log" | tail -6
timeout 150 python3 benchmarks/kernel_features_bench.py > "$dest/features-bench.log" 2>&1
echo "bench exit=$? at $(( $(date +%s) - t0 ))s"; cat "$dest/features-bench.log"
python3 -c "
import json
base = dict(hidden_size=2048, intermediate_size=4096, num_hidden_layers=4, num_attention_heads=16, num_key_value_heads=8,
            head_dim=256, vocab_size=32000, max_position_embeddings=8192)
json.dump(dict(base, model_type='gemma2', attn_logit_softcapping=50.0, final_logit_softcapping=30.0, sliding_window=512,
               query_pre_attn_scalar=256), open('$dest/gemma2.json', 'w'))
"
timeout 150 python3 -m attnprof verify --device cuda --model "$dest/gemma2.json" --impls eager,kernel --dtype bf16 \
  --model-seq 1024 --out "$dest/verify-gemma2" > "$dest/verify-gemma2.log" 2>&1
echo "verify gemma2 exit=$? at $(( $(date +%s) - t0 ))s"; tail -8 "$dest/verify-gemma2.log"
FLASH_TRITON_GLUON_FEATURES=0 timeout 120 python3 -m attnprof verify --device cuda --model "$dest/gemma2.json" \
  --impls eager,kernel --dtype bf16 --model-seq 1024 --out "$dest/verify-gemma2-triton" > "$dest/verify-gemma2-triton.log" 2>&1
echo "verify gemma2 (Triton program) exit=$? at $(( $(date +%s) - t0 ))s"; tail -8 "$dest/verify-gemma2-triton.log"
