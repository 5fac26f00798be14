# Source this on the GPU machine (the `device` tool, carry [".whl"]) from the repository root:
#   source tools/device_env.sh || exit 1
# cffi, pycparser and oneDNN from ./.whl (../shared/device/fetch-wheels.sh --all fills it), libdnnl
# extracted with zipfile (pip --target does not always place it), rawconv from this tree.
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/cffi*.whl .whl/pycparser*.whl .whl/onednn*.whl || return 1
mkdir -p /tmp/dnnl
python3 -c "import zipfile,glob; z=zipfile.ZipFile(glob.glob('.whl/onednn_cpu_gomp*.whl')[0]); open('/tmp/dnnl/libdnnl.so.3','wb').write(z.read('onednn_cpu_gomp-2023.2.0.data/data/lib/libdnnl.so.3'))" || return 1
export PYTHONPATH=$PWD:/tmp/site RAWCONV_DNNL_LIBRARY=/tmp/dnnl/libdnnl.so.3
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null
