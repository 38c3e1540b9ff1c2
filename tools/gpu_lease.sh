#!/usr/bin/env bash
# The GPU measurements of the docs in one command, for a short device lease (about 15
# minutes of device time, 10 a command). Each step gets what is left of LEASE_S
# seconds, most wanted first, and writes into $OUT as it goes, so a step cut short
# still leaves the steps before it (and the bench rows it finished) behind:
#   1. env.txt          GPU, driver, package versions, and a 3-step train.py run on
#                       the GPU; if that fails with the image's flax/optax/orbax, the
#                       pinned ones from .whl/pinned/ are tried (and named here)
#   2. cudnn_test.txt   the cuDNN attention kernel against the einsum core (pytest):
#                       padded and packed rows, ModernBERT's windows, both families
#   3. ab_packed.txt    packed BERT-Base train steps: attention 'jax' against 'cudnn'
#                       (documents as a mask), and unpacked 'cudnn' (key lengths)
#   4. families_gpu.txt the tiny ModernBERT against the tiny BERT at equal wall-clock
#                       time (tools/compare_families.py; its log in families.log;
#                       measured on an H200 on 2026-11-28, tools/results/families_gpu.txt)
#   5. bench.log/.json  BERT-Base in bf16 with batches that fill the GPU: train at 128
#                       and 512, then features; ours, PyTorch (masked head, SDPA,
#                       autocast), HF Flax, torch.compile, then PyTorch as shipped
#   6. ab_cudnn.txt     the train step with and without the cuDNN kernel
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

smoke() {  # a 3-step run of train.py with a checkpoint: the library works on this stack
  rm -rf /tmp/gpu_smoke
  timeout 120 "$py" train.py --config configs/tiny.py --workdir /tmp/gpu_smoke \
    --config.train.num_steps=3 --config.train.warmup_steps=1 --config.progress_bar=False \
    --config.probe.tasks="()" --config.eval_every=3 --config.checkpoint_every=3 2>&1 | tail -4
}
{
  nvidia-smi -L 2>&1 || echo "no nvidia-smi"
  "$py" -c "import jax; print('jax', jax.__version__, jax.devices())"
  "$py" -m pip list 2>/dev/null | grep -i -E '^(jax|jaxlib|flax|optax|orbax|torch|transformers|tokenizers|ml.collections) '
  echo "-- smoke run (train.py, 3 steps)"
  if ! smoke && [[ -z "${SKIP_WHEELS:-}" ]] && ls .whl/pinned/*.whl >/dev/null 2>&1; then
    echo "-- failed with the image's packages: again with .whl/pinned/ ($(ls .whl/pinned | tr '\n' ' '))"
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site_pinned .whl/pinned/*.whl &&
      export PYTHONPATH=/tmp/site_pinned:$PYTHONPATH && smoke
  fi
} >"$out/env.txt" 2>&1
echo "== env.txt"; cat "$out/env.txt"

if [[ -n "$quick" ]]; then
  bench=(--quick --steps 2 --peak-n 256)
  batches=()
  impls=ours,hf_torch_masked,hf_flax,hf_torch  # torch.compile takes minutes on 2 cores
  ab=(--case train_tiny_128 --steps 2)
  packed=(--case train_tiny_128 --steps 2)
  families=(--seconds 5 --seeds 0)
  cudnn=(env)
  select=(-k cudnn -m "not slow")  # the CPU stand-ins of the cuDNN call
  kernel=jax  # no cuDNN off a GPU
else
  bench=(--dtypes bfloat16)
  batches=(--batch train_base_128=256,features_base_128=512,train_base_512=64)
  impls=ours,hf_torch_masked,hf_flax,hf_torch_compiled,hf_torch
  ab=(--case train_base_128 --dtype bfloat16 --batch 256)
  packed=(--case train_base_512 --dtype bfloat16 --batch 32 --steps 10)
  families=(--seconds 30)
  cudnn=(env JAX_PLATFORMS=cuda)
  select=(-k on_a_gpu)  # the real kernel (the stand-ins are CPU tests)
  kernel=cudnn
fi
nodrop=model.attention_dropout_rate=0
pack=objective=mlm,data.packing=True

step cudnn_test.txt 120 "${cudnn[@]}" "$py" -m pytest -q -p no:cacheprovider \
  tests/test_cudnn.py tests/test_model.py "${select[@]}"
step ab_packed.txt 240 "$py" tools/ab_step.py "${packed[@]}" --rounds 1 \
  "$nodrop,$pack,model.attention_kernel=jax" "$nodrop,$pack,model.attention_kernel=$kernel" \
  "$nodrop,model.attention_kernel=$kernel"
step families.log 330 "$py" tools/compare_families.py "${families[@]}" \
  --out "$out/families_gpu.txt"
step bench.log 420 "$py" -m tools.bench "${bench[@]}" ${batches[@]+"${batches[@]}"} \
  --cases train_base_128,train_base_512,features_base_128 \
  --impls "$impls" --out "$out/bench.json"
step ab_cudnn.txt 600 "$py" tools/ab_step.py "${ab[@]}" --rounds 1 \
  "$nodrop" "$nodrop,model.attention_kernel=$kernel"
echo "== done after $((SECONDS - start)) s; in $out: $(ls "$out" | tr '\n' ' ')"
