#!/usr/bin/env bash
# One command on the device machine (one H200 + a 16-core Xeon; see ../shared/device/README.md):
# installs the carried wheels (.whl: cffi, pycparser, onednn-cpu-gomp), points rawconv at the wheel's
# libdnnl, then runs the named steps, each logging to $OUT/<step>.log, each under its own timeout.
#   bash benchmarks/run_h200.sh gpu-tests                 # every test marked gpu
#   bash benchmarks/run_h200.sh resnet50-gpu resnet50-cpu overhead-cpu torch-choice
#   bash benchmarks/run_h200.sh planhost engines train-bench r50-budget   # issue 22's open GPU targets
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1 || exit 1
# optional: pytest-xdist and execnet for gpu-tests-n4 (pip download pytest-xdist execnet --no-deps -d .whl/xd)
ls .whl/xd/*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/xd/*.whl >/dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
mkdir -p /tmp/dnnl
python3 -c "import zipfile,glob; z=zipfile.ZipFile(glob.glob('.whl/onednn_cpu_gomp*.whl')[0]); open('/tmp/dnnl/libdnnl.so.3','wb').write(z.read('onednn_cpu_gomp-2023.2.0.data/data/lib/libdnnl.so.3'))" || exit 1
export RAWCONV_DNNL_LIBRARY=/tmp/dnnl/libdnnl.so.3
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
step() {  # name seconds command...
  local name=$1 secs=$2; shift 2
  echo "== $name (limit ${secs}s): $*"
  local t0=$SECONDS
  timeout "$secs" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "   rc=$rc in $((SECONDS - t0)) s; tail:"; tail -n 4 "$OUT/$name.log" | sed 's/^/   /'
}
for s in "$@"; do
  case $s in
    gpu-tests) step gpu-tests ${T_GPU:-420} python3 -m pytest -q -m gpu tests -p no:cacheprovider -rfs ;;
    gpu-tests-n4) step gpu-tests-n4 ${T_GPU:-420} python3 -m pytest -q -m gpu tests -p no:cacheprovider -rfs --tb=short \
        -n 4 --dist loadfile ;;   # pytest-xdist from .whl/xd (H100, 2026-12-07: 215 s where one process takes 530)
    gpu-k) step gpu-k ${T_K:-150} python3 -m pytest -q -m gpu tests -k "$K" -p no:cacheprovider -rfs ;;
    gpu-tests-new) step gpu-tests-new ${T_GPU:-300} python3 -m pytest -q -m gpu tests/test_ops.py tests/test_nn.py tests/test_fastpath_gpu.py \
        tests/test_fused.py tests/test_convert.py tests/test_capabilities.py -p no:cacheprovider -rfs ;;
    resnet50-gpu) step resnet50-gpu ${T_R50:-420} python3 benchmarks/bench_resnet50.py --json "$OUT/resnet50_gpu.json" ;;
    resnet50-cpu) step resnet50-cpu ${T_R50C:-300} python3 benchmarks/bench_resnet50.py --device cpu --threads 8 \
        --json "$OUT/resnet50_cpu.json" ;;
    overhead-cpu) step overhead-cpu 120 python3 benchmarks/bench_overhead_cpu.py --threads 8 ;;
    overhead-gpu) step overhead-gpu 120 python3 benchmarks/bench_overhead_cuda.py ;;
    torch-choice) step torch-choice ${T_TC:-240} python3 -m rawconv.torch_choice --report resnet50 --batch 32 \
        --dtype float16 --layout nhwc --device cuda --limit ${TC_LIMIT:-8} --json "$OUT/torch_choice.json" ;;
    ddp) step ddp-gpu 240 python3 examples/ddp_small_cnn.py --device cuda --measure-independent ;;
    fuzz-gpu) RAWCONV_FUZZ_EXAMPLES=${FUZZ:-300} step fuzz-gpu ${T_FUZZ:-150} python3 -m pytest -q -s -m gpu tests/test_fuzz.py \
        -p no:cacheprovider -rfs ;;
    train) step train-gpu 180 python3 examples/train_small_cnn.py --device cuda ;;
    r50-diag) step r50-diag${DIAG_TAG:-} ${T_R50:-420} python3 benchmarks/bench_resnet50.py --variants compile_freezing,rawconv,rawconv_cudagraph \
        --profile 3 --tuned ${R50_ARGS:-} ;;
    r50-cpu-diag) step r50-cpu-diag${DIAG_TAG:-} ${T_R50C:-300} python3 benchmarks/bench_resnet50.py --device cpu --threads 8 \
        --variants compile_freezing,rawconv_channels_last ${R50_ARGS:-} ;;
    diag-ref) step diag-ref 120 python3 benchmarks/diag_reference_time.py ;;
    diag-hot) step diag-hot 120 python3 benchmarks/diag_hot_path_cuda.py ;;
    r50-cpu-mallopt) step r50-cpu-mallopt ${T_R50C:-300} python3 benchmarks/bench_resnet50.py --device cpu --threads 8 \
        --variants compile_freezing,rawconv_channels_last --mallopt ;;
    diag-cpu-in-model) step diag-cpu-in-model${DIAG_TAG:-} ${T_DIAG:-420} python3 benchmarks/diag_cpu_in_model.py --threads 8 ${DIAG_ARGS:-} ;;
    planhost) step planhost ${T_PH:-150} python3 benchmarks/diag_modes_cuda.py planhost ;;
    engines) step engines ${T_ENG:-200} python3 benchmarks/diag_modes_cuda.py engines --cap ${ENG_CAP:-150} ;;
    floor) step floor ${T_FLOOR:-150} python3 benchmarks/diag_modes_cuda.py floor ;;
    engines-strict) step engines-strict ${T_ENG:-240} python3 benchmarks/diag_modes_cuda.py engines --strict --cap ${ENG_CAP:-180} ;;
    overhead-ops) step overhead-ops ${T_OV:-240} bash -c "python3 benchmarks/bench_overhead.py --device cuda && \
        python3 benchmarks/bench_overhead.py --device cuda --precision tf32 && \
        python3 benchmarks/bench_overhead.py --device cuda --layout nchw" ;;
    engines-amp) step engines-amp ${T_ENG:-200} python3 benchmarks/diag_modes_cuda.py engines --amp --cap ${ENG_CAP:-150} ;;
    train-bench) step train-bench ${T_TRAIN:-240} python3 benchmarks/bench_resnet50.py --train --train-rounds 3 --train-steps 5 \
        --json "$OUT/train_gpu.json" ;;
    train-tuned) step train-tuned ${T_TRAIN:-300} python3 benchmarks/bench_resnet50.py --train --train-autotune --train-graph \
        --autotune-budget ${TB:-0.3} --train-rounds ${TR:-3} --train-steps 5 --train-cases "${TCASES:-}" \
        --json "$OUT/train_gpu_tuned.json" ;;
    train-compile) step train-compile ${T_TRAIN:-420} python3 benchmarks/bench_resnet50.py --train --train-compile \
        --train-rounds ${TR:-2} --train-steps 5 --train-cases "${TCASES:-}" --json "$OUT/train_gpu_compile.json" ;;
    r50-budget) step r50-budget${DIAG_TAG:-} ${T_R50:-420} python3 benchmarks/bench_resnet50.py \
        --variants eager,compile_freezing,compile_reduce_overhead,rawconv_compile_cudagraph,rawconv_reduce_overhead \
        --autotune-budget ${BUDGET:-3} --tuned --json "$OUT/resnet50_budget.json" ;;
    zoo-gpu-1) step zoo-gpu-1 ${T_ZOO:-420} python3 benchmarks/zoo.py --models ${ZOO_MODELS:-resnet50,efficientnet_b0,mobilenetv3_large_100} \
        --json "$OUT/zoo_gpu_1.json" --markdown ;;
    zoo-gpu-2) step zoo-gpu-2 ${T_ZOO:-420} python3 benchmarks/zoo.py --models ${ZOO_MODELS:-regnety_016,convnext_tiny,unet} \
        --json "$OUT/zoo_gpu_2.json" --markdown ;;
    zoo-dw) step zoo-dw ${T_ZOO:-300} python3 benchmarks/zoo.py --depthwise --json "$OUT/zoo_gpu_depthwise.json" --markdown ;;
    zoo-cpu) step zoo-cpu ${T_ZOOC:-420} taskset -c 0-7 python3 benchmarks/zoo.py --device cpu --threads 8 --isolate \
        --models ${ZOO_CPU_MODELS:-resnet50,efficientnet_b0,mobilenetv3_large_100,convnext_tiny,regnety_016} ${ZOO_CPU_ARGS:-} \
        --json "$OUT/zoo_cpu.json" --markdown ;;
    nan-guard-cpu) step nan-guard-cpu ${T_NG:-240} taskset -c 8-15 python3 benchmarks/bench_nan_guard.py --threads 8 ;;
    diag-grad) step diag-grad ${T_DG:-120} python3 benchmarks/diag_grad_gpu.py ;;
    diag-train) step diag-train ${T_DT:-150} python3 benchmarks/diag_train_gpu.py --model ${DIAG_MODEL:-regnety_016} ;;
    diag-train-host) step diag-train-host ${T_DT:-150} python3 benchmarks/diag_train_host_gpu.py --model ${DIAG_MODEL:-regnety_016} ;;
    gpu-failed) step gpu-failed ${T_GF:-150} python3 -m pytest -q -p no:cacheprovider -rf --tb=short \
        tests/test_torch_compat.py::test_cuda_zero_input_channels_give_the_bias \
        tests/test_fastpath_gpu.py::test_graph_hot_path_follows_in_place_changes tests/test_convert_right_gpu.py ;;
    lscpu) step lscpu 30 bash -c 'lscpu; nproc; python3 -c "import torch; print(torch.__config__.parallel_info())"' ;;
    *) echo "unknown step $s"; exit 2 ;;
  esac
done
