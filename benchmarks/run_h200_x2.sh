#!/bin/bash
# The GPU tests and the full graph-API benchmark on a two-GPU H200 machine, in parallel:
#   GPU 0: the legacy-API GPU tests, then the NHWC benchmark;
#   GPU 1: the graph-API GPU tests, the host-overhead measurement, then the NCHW benchmark;
# then one summary table. Logs under $OUT.
# Usage: OUT=dir BUDGET=4.5 [T0=460 T1=420 (seconds each benchmark may run)] bash benchmarks/run_h200_x2.sh
set -u
B=${BUDGET:-4.5}
( CUDA_VISIBLE_DEVICES=0 timeout 100 python3 -m pytest -q -m gpu tests/test_cudnn_gpu.py -p no:cacheprovider \
      > $OUT/gpu-tests-legacy.log 2>&1
  CUDA_VISIBLE_DEVICES=0 timeout ${T0:-460} python3 benchmarks/bench_cudnn_graph.py --layouts nhwc \
      --modes fp16,bf16,tf32,fp32 --budget $B --no-overhead --json $OUT/nhwc.json > $OUT/nhwc.txt 2>&1 ) &
( CUDA_VISIBLE_DEVICES=1 timeout 150 python3 -m pytest -q -m gpu tests/test_cudnn_graph_gpu.py -p no:cacheprovider \
      > $OUT/gpu-tests-graph.log 2>&1
  CUDA_VISIBLE_DEVICES=1 python3 benchmarks/bench_cudnn_graph.py --layers 0 --modes fp16 --layouts nhwc \
      > $OUT/overhead.txt 2>&1
  CUDA_VISIBLE_DEVICES=1 timeout ${T1:-420} python3 benchmarks/bench_cudnn_graph.py --layouts nchw \
      --modes fp16,bf16,tf32,fp32 --budget $B --no-overhead --json $OUT/nchw.json > $OUT/nchw.txt 2>&1 ) &
wait
python3 benchmarks/bench_cudnn_graph.py --summary $OUT/nhwc.json $OUT/nchw.json > $OUT/summary.txt 2>&1
