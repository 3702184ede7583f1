#!/usr/bin/env bash
# Everything the lent GPU machine checks, in one call (device minutes are few): the CUDA tests, the attention
# kernels' table (bench/paged_attention.py) and the engine's figures (bench/engine_gpu.py). From the repo root:
#   bash bench/gpu_check.sh
# Wheels in .whl/ (Velo's dependencies that machine lacks, built for its Python) are installed first; logs go to
# $OUT (the device tool's folder) or ./gpu_out.
set -uo pipefail
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1 \
  TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)' | tee -a "$OUT/gpu.txt"
timeout "${TESTS_S:-150}" python3 -m pytest -q -p no:cacheprovider -p no:warnings --basetemp=/tmp/velo_pt \
  tests/engine/test_cuda.py tests/engine/test_triton_attention.py tests/proxy/test_cuda_serve.py \
  > "$OUT/pytest.log" 2>&1
echo "pytest rc=$?"; grep -E "passed|failed|error" "$OUT/pytest.log" | tail -3
find /tmp/velo_pt -name velo.log -exec tail -15 {} \; >> "$OUT/pytest.log" 2>/dev/null
timeout "${ATTENTION_S:-150}" python3 bench/paged_attention.py 2>&1 | tee "$OUT/attention.log"
timeout "${ENGINE_S:-280}" python3 bench/engine_gpu.py --profile 2>&1 | grep -v "it/s\]" | tee "$OUT/engine.log" \
  || timeout 120 python3 bench/engine_gpu.py --no-graphs --skip-hf 2>&1 | grep -v "it/s\]" | tee -a "$OUT/engine.log"
