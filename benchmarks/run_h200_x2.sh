#!/bin/bash
# The full graph-API benchmark on a two-GPU H200 machine: NHWC on GPU 0 (after the GPU
# tests), NCHW on GPU 1, host overhead first on GPU 1; then one summary. Logs under $OUT.
# Usage: OUT=dir BUDGET=4.5 [T0=450 T1=500 (seconds each bench may run)] bash benchmarks/run_h200_x2.sh
set -u
B=${BUDGET:-4.5}
( CUDA_VISIBLE_DEVICES=0 timeout ${TT:-110} python3 -m pytest -q -m gpu tests -p no:cacheprovider \
      > $OUT/gpu-tests.log 2>&1
  CUDA_VISIBLE_DEVICES=0 timeout ${T0:-450} python3 benchmarks/bench_cudnn_graph.py --layouts nhwc --modes fp16,bf16,tf32,fp32 \
      --budget $B --no-overhead --json $OUT/nhwc.json > $OUT/nhwc.txt 2>&1 ) &
( CUDA_VISIBLE_DEVICES=1 python3 benchmarks/bench_cudnn_graph.py --layers 0 --modes fp16 --layouts nhwc \
      > $OUT/overhead.txt 2>&1
  CUDA_VISIBLE_DEVICES=1 timeout ${T1:-500} python3 benchmarks/bench_cudnn_graph.py --layouts nchw --modes fp16,bf16,tf32,fp32 \
      --budget $B --no-overhead --json $OUT/nchw.json > $OUT/nchw.txt 2>&1 ) &
wait
python3 benchmarks/bench_cudnn_graph.py --summary $OUT/nhwc.json $OUT/nchw.json > $OUT/summary.txt 2>&1
