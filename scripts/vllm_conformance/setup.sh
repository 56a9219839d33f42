#!/usr/bin/env bash
# Builds a CPU-only environment in which vLLM's own V1 scheduler runs (no GPU, no CUDA).
# Only record.py needs it; the project's tests use the recorded golden files instead.
# Usage: bash setup.sh DIR      (about 1.3 GB; a few minutes)
# Then:  PYTHONPATH=DIR/src DIR/venv/bin/python record.py \
#          ../../simcore/data/conformance/scenarios/basic.json.gz /tmp/basic.jsonl
set -euo pipefail
dir=${1:?usage: setup.sh DIR}
mkdir -p "$dir/whl" "$dir/src"
python3 -m venv "$dir/venv"
pip=("$dir/venv/bin/pip" install -q)
# vLLM itself: only its Python files, none of its CUDA dependencies.
"$dir/venv/bin/pip" download -q --no-deps -d "$dir/whl" vllm==0.33.0
(cd "$dir/src" && python3 -m zipfile -e "$dir"/whl/vllm-0.33.0-*.whl . && find . -name '*.so' -delete)
# A CPU build of torch: the machine image carries one; otherwise the CPU index build.
"${pip[@]}" torch==2.13.0 || "${pip[@]}" torch==2.13.0+cpu
"${pip[@]}" numpy regex cachetools psutil msgspec 'pydantic>=2.12' pyzmq cloudpickle cbor2 pybase64 \
  'transformers==5.20.*' huggingface_hub tokenizers safetensors requests aiohttp prometheus_client \
  py-cpuinfo pyyaml filelock tqdm blake3 packaging pillow einops oss-harmony openai uvloop fastapi \
  partial_json_parser llguidance
"${pip[@]}" --no-deps xgrammar apache-tvm-ffi==0.1.11
echo "ready: PYTHONPATH=$dir/src $dir/venv/bin/python record.py SCENARIO OUT"
