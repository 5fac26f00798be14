#!/bin/bash
# This session's closing H200 run (two GPUs, one process each, logs under $OUT):
#   GPU 0: the relayout GPU tests, then NHWC fp16,bf16, then NCHW fp16 (autotune relayout=True);
#   GPU 1: the host-overhead measurement, then NHWC tf32,fp32, then NCHW bf16 (relayout=True);
# all at BUDGET seconds of autotune per layer; then one summary table.
# Usage: OUT=dir BUDGET=5 bash benchmarks/run_h200_x2_final.sh
set -u
B=${BUDGET:-5}
bench() {  # gpu layouts modes json seconds
  CUDA_VISIBLE_DEVICES=$1 timeout $5 python3 benchmarks/bench_cudnn_graph.py --layouts $2 --modes $3 \
      --budget $B --relayout --no-overhead --json $OUT/$4.json > $OUT/$4.txt 2>&1
}
( CUDA_VISIBLE_DEVICES=0 timeout 60 python3 -m pytest -q -m gpu tests/test_cudnn_graph_gpu.py -p no:cacheprovider \
      -k "relayout or nhwc_config" > $OUT/gpu-tests-relayout.log 2>&1
  bench 0 nhwc fp16,bf16 nhwc-16 ${T0:-330}
  bench 0 nchw fp16 nchw-fp16 ${T0B:-170} ) &
( CUDA_VISIBLE_DEVICES=1 python3 benchmarks/bench_cudnn_graph.py --layers 0 --modes fp16 --layouts nhwc \
      > $OUT/overhead.txt 2>&1
  bench 1 nhwc tf32,fp32 nhwc-32 ${T1:-330}
  bench 1 nchw bf16 nchw-bf16 ${T1B:-150} ) &
wait
python3 benchmarks/bench_cudnn_graph.py --summary $OUT/nhwc-16.json $OUT/nhwc-32.json $OUT/nchw-fp16.json \
    $OUT/nchw-bf16.json > $OUT/summary.txt 2>&1
