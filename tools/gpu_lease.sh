#!/usr/bin/env bash
# The GPU measurements of docs/performance.md in one command, for a short device lease
# (about 15 minutes of device time, 10 a command). Each step gets what is left of
# LEASE_S seconds, most wanted first, and writes into $OUT as it goes, so a step cut
# short still leaves the steps before it (and the bench rows it finished) behind:
#   1. env.txt        GPU, driver, package versions
#   2. cudnn_test.txt the cuDNN attention kernel against the einsum path (pytest)
#   3. bench.json/.md BERT-Base in bf16 with batches that fill the GPU: train at 128
#                     and 512 (the issue's MFU targets), then features; ours, PyTorch
#                     (masked head, SDPA, autocast), HF Flax, torch.compile, then
#                     PyTorch as shipped
#   4. ab_cudnn.txt   the train step with and without the cuDNN kernel
#
# Here, first: `bash tools/gpu_wheels.sh` (fills .whl/). On the device, from the
# repository root, with `.whl` carried:  bash tools/gpu_lease.sh
# Then here: python -m tools.bench --from-json <files_at>/bench.json --readme
# `SKIP_WHEELS=1 PYTHON=.venv/bin/python bash tools/gpu_lease.sh --quick` runs the same
# steps here with 2-layer models and batch <= 4: the plumbing, not a measurement.
set -uo pipefail
export PYTHONUNBUFFERED=1
quick=""; [[ "${1:-}" == "--quick" ]] && quick=1
out=${OUT:-tools/results/gpu_lease}
mkdir -p "$out"
budget=${LEASE_S:-560}
start=$SECONDS
py=${PYTHON:-python3}

source "$(dirname "$0")/steps.sh"

if [[ -z "${SKIP_WHEELS:-}" ]] && ls .whl/*.whl >/dev/null 2>&1; then
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi

{
  nvidia-smi -L 2>&1 || echo "no nvidia-smi"
  "$py" -c "import jax; print('jax', jax.__version__, jax.devices())"
  "$py" -m pip list 2>/dev/null | grep -i -E '^(jax|jaxlib|flax|optax|orbax|torch|transformers|tokenizers|ml.collections) '
} >"$out/env.txt" 2>&1
echo "== env.txt"; cat "$out/env.txt"

if [[ -n "$quick" ]]; then
  bench=(--quick --steps 2 --peak-n 256)
  batches=()
  impls=ours,hf_torch_masked,hf_flax,hf_torch  # torch.compile takes minutes on 2 cores
  ab=(--case train_tiny_128 --steps 2)
  cudnn=(env)
else
  bench=(--dtypes bfloat16)
  batches=(--batch train_base_128=256,features_base_128=512,train_base_512=64)
  impls=ours,hf_torch_masked,hf_flax,hf_torch_compiled,hf_torch
  ab=(--case train_base_128 --dtype bfloat16 --batch 256)
  cudnn=(env JAX_PLATFORMS=cuda)
fi

step cudnn_test.txt 90 "${cudnn[@]}" "$py" -m pytest -q -p no:cacheprovider \
  tests/test_model.py -k cudnn
step bench.log 420 "$py" -m tools.bench "${bench[@]}" ${batches[@]+"${batches[@]}"} \
  --cases train_base_128,train_base_512,features_base_128 \
  --impls "$impls" \
  --out "$out/bench.json" --md "$out/bench.md"
kernel=model.attention_kernel=cudnn
[[ -n "$quick" ]] && kernel=model.attention_kernel=jax  # no cuDNN off a GPU
step ab_cudnn.txt 600 "$py" tools/ab_step.py "${ab[@]}" --rounds 1 \
  model.attention_dropout_rate=0 "model.attention_dropout_rate=0,$kernel"
echo "== done after $((SECONDS - start)) s; in $out: $(ls "$out" | tr '\n' ' ')"
