# Sourced by tools/gpu_lease.sh and tools/bf16_cpu_round.sh: steps that share one time
# budget. The caller sets `out` (the folder), `budget` (seconds) and `start` ($SECONDS
# when the budget began).

left() {  # seconds left of the budget, at most $1
  local rest=$((budget - (SECONDS - start)))
  ((rest > $1)) && rest=$1
  ((rest < 1)) && rest=1
  echo "$rest"
}

step() {  # step NAME CAP COMMAND...: runs COMMAND for at most CAP seconds, logs to NAME
  local name=$1 cap=$2; shift 2
  if ((SECONDS - start >= budget)); then
    echo "skipped: no time left" >"$out/$name"; return
  fi
  local t=$SECONDS
  timeout "$(left "$cap")" "$@" >"$out/$name" 2>&1
  echo "== $name: exit $? after $((SECONDS - t)) s"
}
