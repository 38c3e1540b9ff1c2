#!/usr/bin/env bash
# The picture in docs/training.md ("Watching a run"): TensorBoard's Profile tab on a
# profile a run wrote, taken with headless Chromium.
#
#   bash tools/screenshot_profile.sh [out.png]
#
# Needs chromium (Debian: apt-get install chromium) and, in a venv of their own (they
# are not bert-jax's requirements), tensorboard and tensorboard-plugin-profile.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-docs/images/tensorboard_profile.png}"
tmp="$(mktemp -d)"
trap 'kill $tb 2>/dev/null || true; rm -rf "$tmp"' EXIT
python3 -m venv "$tmp/tb" && "$tmp/tb/bin/pip" install -q tensorboard tensorboard-plugin-profile
flags=$(cd tests && python -c "import tiny_run; print(' '.join(tiny_run.flags(**{'train.num_steps': 12, 'probe.tasks': ()})))")
# shellcheck disable=SC2086
python train.py --workdir "$tmp/run" $flags "--config.profile.steps=(4,8)"
"$tmp/tb/bin/tensorboard" --logdir "$tmp/run/tensorboard" --port 6006 >"$tmp/tb.log" 2>&1 &
tb=$!
sleep 15
chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1500,950 \
  --virtual-time-budget=20000 --screenshot="$out" "http://localhost:6006/#profile"
echo "wrote $out"
