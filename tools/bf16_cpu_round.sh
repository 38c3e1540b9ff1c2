#!/usr/bin/env bash
# Issue 22's measurements on a CPU with native bf16 dots (`amx_bf16` or `avx512_bf16` in
# /proc/cpuinfo), in one unattended command: about 100 minutes on 2 cores. Run it on an
# idle machine and start nothing else meanwhile. Steps, most wanted first, each within
# what is left of ROUND_S seconds (default 6600), each writing into $OUT
# (default tools/results/bf16_cpu_round) as it goes:
#   1. env.txt                   CPU model and bf16 flags, cores, package versions
#   2. bench_matmul.txt          jitted dots per dtype and layout, model f32 vs mixed
#   3. bench.log (+ the table)   python -m tools.bench --readme: the README's table and
#                                tools/results/results.{json,md}, with the bf16 peers
#   4. profile_train_small_bf16.txt, profile_features_base_bf16.txt
#                                where the mixed-precision step's time goes
#   5. ab_forward_dots_bf16.txt  features: YNNPACK fusions against XLA's own dots
#   6. ab_attention_softmax_bf16_{small,base}.txt
#                                train: softmax divided before / after the context dot
#   7. bench_retain.{json,md,log} the bench again with glibc keeping freed memory
#                                (PyTorch's best allocator)
# Then write the results into docs/performance.md (Results, Targets, levers).
# `--quick` runs the same steps anywhere on 2-layer models in minutes, into a folder
# under /tmp: the plumbing, not a measurement.
set -uo pipefail
export PYTHONUNBUFFERED=1
quick=""; [[ "${1:-}" == "--quick" ]] && quick=1
py=${PYTHON:-python3}
cpuinfo=${CPUINFO:-/proc/cpuinfo}
flags=$(grep -o -w -E 'amx_bf16|avx512_bf16' "$cpuinfo" 2>/dev/null | sort -u | tr '\n' ' ')
if [[ -z "$quick" && -z "$flags" ]]; then
  echo "error: $cpuinfo shows neither amx_bf16 nor avx512_bf16: bf16 dots are emulated" \
    "on this CPU, so its numbers do not count for issue 22; run this on a CPU that has" \
    "one (--quick runs the steps anywhere, measuring nothing)" >&2
  exit 2
fi
if [[ -n "$quick" ]]; then
  out=${OUT:-${TMPDIR:-/tmp}/bf16_cpu_round_quick}
  bench=(--quick --steps 2 --peak-n 256 --cases train_tiny_128,features_base_128
         --impls ours,hf_torch_masked)
  table=(--out "$out/bench.json" --md "$out/bench.md")  # not the tracked results
  matmul=(--quick --skip-model)
  prof=(--steps 1 --top 3)
  small=(--case train_tiny_128 --steps 2 --rounds 1)
  base=(--case train_tiny_128 --steps 2 --rounds 1)
  features=(--case train_tiny_128 --steps 2 --rounds 1)
  prof_small=train_tiny_128; prof_features=train_tiny_128
else
  out=${OUT:-tools/results/bf16_cpu_round}
  bench=()
  table=(--readme)  # docs/performance.md's table, tools/results/results.{json,md}
  matmul=()
  prof=(--steps 2 --top 12)
  small=(--case train_small_128 --steps 8 --rounds 3)
  base=(--case train_base_128 --steps 4 --rounds 3)
  features=(--case features_base_128 --steps 4 --rounds 3)
  prof_small=train_small_128; prof_features=features_base_128
fi
mkdir -p "$out"
budget=${ROUND_S:-6600}
start=$SECONDS
source "$(dirname "$0")/steps.sh"

{
  date -u +"%Y-%m-%d %H:%M UTC"
  grep -m1 'model name' "$cpuinfo"; echo "bf16 flags: ${flags:-none}"; nproc
  "$py" -c "import jax; print('jax', jax.__version__, jax.devices())"
  "$py" -m pip list 2>/dev/null | grep -i -E '^(jax|jaxlib|flax|optax|torch|transformers) '
} >"$out/env.txt" 2>&1
echo "== env.txt"; cat "$out/env.txt"

# Each A/B variant runs twice a round, A B B' A' (the primed twin adds a setting that
# does not change the program), so the order within a round cancels out.
twin=model.cpu_forward_dots=ynnpack  # training programs never take cpu_forward_dots
step bench_matmul.txt 900 "$py" tools/bench_matmul.py ${matmul[@]+"${matmul[@]}"}
step bench.log 3000 "$py" -m tools.bench ${bench[@]+"${bench[@]}"} "${table[@]}"
step profile_train_small_bf16.txt 600 "$py" tools/profile_step.py --case "$prof_small" \
  --dtype bfloat16 "${prof[@]}"
step profile_features_base_bf16.txt 600 "$py" tools/profile_step.py \
  --case "$prof_features" --dtype bfloat16 "${prof[@]}"
step ab_forward_dots_bf16.txt 900 "$py" tools/ab_step.py "${features[@]}" --dtype bfloat16 \
  model.cpu_forward_dots=ynnpack model.cpu_forward_dots=eigen \
  model.cpu_forward_dots=eigen,model.remat=False model.cpu_forward_dots=ynnpack,model.remat=False
step ab_attention_softmax_bf16_small.txt 900 "$py" tools/ab_step.py "${small[@]}" \
  --dtype bfloat16 model.attention_softmax=standard model.attention_softmax=deferred \
  "model.attention_softmax=deferred,$twin" "model.attention_softmax=standard,$twin"
step ab_attention_softmax_bf16_base.txt 1200 "$py" tools/ab_step.py "${base[@]}" \
  --dtype bfloat16 model.attention_softmax=standard model.attention_softmax=deferred \
  "model.attention_softmax=deferred,$twin" "model.attention_softmax=standard,$twin"
step bench_retain.log 3000 "$py" -m tools.bench ${bench[@]+"${bench[@]}"} --malloc retain \
  --out "$out/bench_retain.json" --md "$out/bench_retain.md"
echo "== done after $((SECONDS - start)) s; in $out: $(ls "$out" | tr '\n' ' ')"
