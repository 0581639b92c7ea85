#!/usr/bin/env bash
# The checks that need a CUDA GPU, in one run: the GPU tests (pairs and mask learning against the CPU), then
# mask learning on an 8 B-shaped bfloat16 Llama pair read from its files, at two batch sizes, and with θ_ft a
# LoRA adapter of the base (rank 16, every linear layer of the body).
#
#     bash benchmarks/gpu.sh [OUT]        # OUT: where the logs go (default: the current folder)
#
# SIZE (default 8b), BATCHES (default "8 32"), LORA (default 1; 0 skips it) and DEVICE (default cuda) change
# what it runs; DEVICE=cpu
# SIZE=20m runs the same steps on a machine without a GPU (the tests then skip).
set -uo pipefail
out=${1:-.}
size=${SIZE:-8b}
device=${DEVICE:-cuda}
python=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
work=${WORKDIR:-/tmp/graftui-bench-scale}
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
$python -c "import torch, transformers, peft; print('torch', torch.__version__, '· transformers', transformers.__version__, '· peft', peft.__version__)"
# --noconftest: the suite's conftest finds the offline default models, which a bare GPU machine lacks
timeout 300 $python -m pytest -q --noconftest -p no:cacheprovider tests/test_gpu.py 2>&1 | tee "$out/gpu-tests.txt"
for batch in ${BATCHES:-8 32}; do
    timeout 420 $python benchmarks/bench_scale.py --sizes "$size" --device "$device" --dtype bfloat16 --pair files \
        --candidates 5 --steps 10 --batch "$batch" --workdir "$work" 2>&1 | tee "$out/scale-$size-b$batch.txt"
done
if [ "${LORA:-1}" != 0 ]; then
    timeout 420 $python benchmarks/bench_scale.py --sizes "$size" --device "$device" --dtype bfloat16 --pair lora \
        --candidates 5 --steps 10 --batch 8 --workdir "$work" 2>&1 | tee "$out/scale-$size-lora.txt"
fi
