#!/usr/bin/env bash
# Downloads, here, the wheels the GPU lease (tools/gpu_lease.sh) installs there: the
# device image (Python 3.12, jax 0.11 with CUDA, torch, transformers 5) lacks
# ml-collections and array-record, and its transformers 5 has no Flax models, so
# HF Flax needs transformers 4.57.6 with the tokenizers and huggingface-hub it accepts.
# Run from the repository root; `.whl/` is git-ignored and travels with `carry`.
#
#   bash tools/gpu_wheels.sh [PYTHON]      # PYTHON: any python with pip (default python3)
set -euo pipefail
py=${1:-python3}
mkdir -p .whl
for w in ml-collections==1.1.0 array-record==0.8.6 transformers==4.57.6 \
         tokenizers==0.22.2 huggingface-hub==0.36.0; do
  "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 -d .whl "$w"
done
du -sh .whl
