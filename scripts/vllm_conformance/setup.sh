#!/usr/bin/env bash
# Builds a CPU-only environment in which vLLM's own V1 scheduler runs (no GPU, no CUDA).
# Only the recorder needs it; the project's tests use the recorded golden files instead.
# Usage: bash setup.sh DIR [VERSION]      (VERSION: vLLM's, default 0.33.0; about 1.3 GB, minutes)
# Then:  dse conformance SCENARIO --record-with-installed-vllm \
#          --vllm-python DIR/venv/bin/python --vllm-path DIR/src
set -euo pipefail
dir=${1:?usage: setup.sh DIR [VERSION]}
version=${2:-0.33.0}
mkdir -p "$dir/whl" "$dir/src"
python3 -m venv "$dir/venv"
pip=("$dir/venv/bin/pip" install -q)
# vLLM itself: only its Python files, none of its CUDA dependencies.
"$dir/venv/bin/pip" download -q --no-deps -d "$dir/whl" "vllm==$version"
(cd "$dir/src" && python3 -m zipfile -e "$dir"/whl/vllm-"$version"-*.whl . && find . -name '*.so' -delete)
# A CPU build of torch: the machine image carries one; otherwise the CPU index build.
"${pip[@]}" torch==2.13.0 || "${pip[@]}" torch==2.13.0+cpu
"${pip[@]}" numpy regex cachetools psutil msgspec 'pydantic>=2.12' pyzmq cloudpickle cbor2 pybase64 \
  'transformers==5.20.*' huggingface_hub tokenizers safetensors requests aiohttp prometheus_client \
  py-cpuinfo pyyaml filelock tqdm blake3 packaging pillow einops oss-harmony openai uvloop fastapi \
  partial_json_parser llguidance
"${pip[@]}" --no-deps xgrammar apache-tvm-ffi==0.1.11
echo "ready: dse conformance SCENARIO --record-with-installed-vllm --vllm-python $dir/venv/bin/python --vllm-path $dir/src"
