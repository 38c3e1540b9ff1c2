#!/usr/bin/env bash
# Downloads, here, the wheels the GPU lease (tools/gpu_lease.sh) installs there: the
# device image (Python 3.12, jax 0.11 with CUDA, torch, transformers 5) lacks
# ml-collections, array-record and tensorboardX, and its transformers 5 has no Flax models, so
# HF Flax needs transformers 4.57.6 with the tokenizers and huggingface-hub it accepts.
# Run from the repository root; `.whl/` is git-ignored and travels with `carry`.
#
#   bash tools/gpu_wheels.sh [PYTHON]      # PYTHON: any python with pip (default python3)
set -euo pipefail
py=${1:-python3}
pin() {  # NAME==VERSION as requirements*.txt pin it, the versions the tests ran with
  grep -h -i -E "^$1==" requirements.txt requirements-peers.txt ||
    { echo "error: requirements*.txt: no pin for $1" >&2; exit 2; }
}
mkdir -p .whl .whl/pinned
get() {  # get DIR NAME==VERSION: the CPython 3.12 manylinux wheel of it, into DIR
  "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 -d "$1" "$2"
}
# huggingface-hub is no pin of ours: 0.36.0 is a release transformers 4.57.6 accepts (< 1.0).
for w in "$(pin ml-collections)" "$(pin array-record)" "$(pin tensorboardX)" \
         "$(pin transformers)" "$(pin tokenizers)" huggingface-hub==0.36.0; do
  get .whl "$w"
done
# The device's jax (0.11 on Python 3.12) is newer than ours and its jaxlib too large to
# carry: the lease runs on it, with the image's flax, optax and Orbax unless a 3-step
# run fails with them; then it installs these, the versions our tests ran with.
for w in "$(pin flax)" "$(pin optax)" "$(pin orbax-checkpoint)"; do
  get .whl/pinned "$w"
done
du -sh .whl
