# Source this on the GPU machine (the `device` tool, carry [".whl"]) from the repository root:
#   source tools/device_env.sh || exit 1
# cffi, pycparser and oneDNN from ./.whl (../shared/device/fetch-wheels.sh --all fills it), libdnnl
# extracted with zipfile (pip --target does not always place it), rawconv from this tree.
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/cffi*.whl .whl/pycparser*.whl .whl/onednn*.whl || return 1
mkdir -p /tmp/dnnl
python3 -c "import zipfile,glob; z=zipfile.ZipFile(glob.glob('.whl/onednn_cpu_gomp*.whl')[0]); open('/tmp/dnnl/libdnnl.so.3','wb').write(z.read('onednn_cpu_gomp-2023.2.0.data/data/lib/libdnnl.so.3'))" || return 1
export PYTHONPATH=$PWD:/tmp/site RAWCONV_DNNL_LIBRARY=/tmp/dnnl/libdnnl.so.3
# optional: pytest-xdist and execnet (pip download pytest-xdist execnet --no-deps -d .whl/xd): `-m gpu -n 4 --dist loadfile`
ls .whl/xd/*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/xd/*.whl >/dev/null 2>&1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null
# optional: oneDNN 3.6.2 (paddlepaddle 3.3.1's libdnnl.so.3, GNU OpenMP), carried as .whl/libdnnl36.so.3.xz (9.4 MB;
# made here by: pip download --no-deps paddlepaddle==3.3.1, zipfile's paddle/libs/libdnnl.so.3, xz -6):
# decompressed to /tmp/dnnl36/libdnnl.so.3 for RAWCONV_DNNL_LIBRARY / diag_cpu_gap.py --libs
if [ -f .whl/libdnnl36.so.3.xz ]; then
  mkdir -p /tmp/dnnl36 && python3 -c "import lzma,shutil; shutil.copyfileobj(lzma.open('.whl/libdnnl36.so.3.xz'), open('/tmp/dnnl36/libdnnl.so.3','wb'))" && export RAWCONV_DNNL36=/tmp/dnnl36/libdnnl.so.3
fi
