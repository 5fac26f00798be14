#!/bin/bash
# The GPU tests and the graph-API benchmark on a two-GPU H200 machine, in parallel:
#   GPU 0: the legacy-API GPU tests, then the benchmark RUN0 ("layout modes");
#   GPU 1: the graph-API GPU tests, the host-overhead measurement, then the benchmark RUN1;
# then one summary table. NCHW layers autotune with relayout=True. Logs under $OUT.
# Usage: OUT=dir BUDGET=8 [RUN0="nhwc fp16,bf16,tf32,fp32"] [RUN1="nchw fp16,bf16,tf32,fp32"]
#        [T0=460 T1=420 (seconds each benchmark may run)] [TESTS=0 (skip the tests)] bash benchmarks/run_h200_x2.sh
set -u
B=${BUDGET:-8}
read -r L0 M0 <<< "${RUN0:-nhwc fp16,bf16,tf32,fp32}"
read -r L1 M1 <<< "${RUN1:-nchw fp16,bf16,tf32,fp32}"
( if [ "${TESTS:-1}" = 1 ]; then
    CUDA_VISIBLE_DEVICES=0 timeout 100 python3 -m pytest -q -m gpu tests/test_cudnn_gpu.py -p no:cacheprovider \
        > $OUT/gpu-tests-legacy.log 2>&1
  fi
  CUDA_VISIBLE_DEVICES=0 timeout ${T0:-460} python3 benchmarks/bench_cudnn_graph.py --layouts $L0 --modes $M0 \
      --budget $B --relayout --no-overhead --json $OUT/gpu0.json > $OUT/gpu0.txt 2>&1 ) &
( if [ "${TESTS:-1}" = 1 ]; then
    CUDA_VISIBLE_DEVICES=1 timeout 200 python3 -m pytest -q -m gpu tests/test_cudnn_graph_gpu.py -p no:cacheprovider \
        > $OUT/gpu-tests-graph.log 2>&1
    CUDA_VISIBLE_DEVICES=1 python3 benchmarks/bench_cudnn_graph.py --layers 0 --modes fp16 --layouts nhwc \
        > $OUT/overhead.txt 2>&1
  fi
  CUDA_VISIBLE_DEVICES=1 timeout ${T1:-420} python3 benchmarks/bench_cudnn_graph.py --layouts $L1 --modes $M1 \
      --budget $B --relayout --no-overhead --json $OUT/gpu1.json > $OUT/gpu1.txt 2>&1 ) &
wait
python3 benchmarks/bench_cudnn_graph.py --summary $OUT/gpu0.json $OUT/gpu1.json > $OUT/summary.txt 2>&1
