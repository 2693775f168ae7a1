#!/usr/bin/env bash
# The GPU check, as one call (<= 8 min on one GPU): envcheck's table with its GPU checks (<= 90 s), then
# bench/gpu_check.py's matrix (bench/gpu_matrix.py, <= 360 s: the candidate defaults, the 2026-12-04 config (the defaults until measured)
# they replace, the full 30-layer model or the deepest the plan fits, then one option changed at a time;
# 3 steps each at the cluster config's shapes; step-time breakdown, MFU, recompiles, peak memory and
# step time against trainer/plan's predictions). Writes gpu_check.json and the table gpu_check.md.
#
#   bench/gpu_check.sh [--dry-run] [OUT_DIR]      # OUT_DIR default: $OUT, else bench/results/gpu_check
#
# Writes OUT_DIR/gpu_check.json (the result; also on a machine without a GPU, where it says "no_gpu")
# and OUT_DIR/envcheck.json. Python: $PYTHON, else the tree's .venv (built by bin/_tool_env.sh when it
# is missing and PyPI is reachable), else python3. Exit: 0 measured and checked against the plan;
# 4 measured but the plan failed (nothing checked); 3 no GPU or --dry-run (nothing is measured, nothing
# faked); anything else: the step that failed.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dry=()
if [[ "${1:-}" == "--dry-run" ]]; then
  dry=(--dry-run)
  shift
fi
out_dir="${1:-${OUT:-$root/bench/results/gpu_check}}"
mkdir -p "$out_dir"

python="${PYTHON:-}"
if [[ -z "$python" ]]; then
  if [[ -x "$root/.venv/bin/python" ]]; then
    python="$root/.venv/bin/python"
  else
    python="$(command -v python3)"
  fi
fi
echo "gpu_check: python $python; results in $out_dir"

gpu=0
if [[ ${#dry[@]} -eq 0 ]] && "$python" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  gpu=1
fi

if [[ $gpu -eq 1 ]]; then
  # the full table (bin/envcheck's module) run by this python against its own prefix, GPU rows
  # included; its verdict is recorded, not fatal (a bare machine's python is no provisioned env: those
  # rows FAIL and say so). Not through bin/envcheck: that builds the tool env from PyPI first, which a
  # GPU machine without a network cannot reach.
  prefix="$("$python" -c 'import sys; print(sys.prefix)')"
  set +e
  LINGBOT_REPO_ROOT="$root" timeout 90 "$python" -m provision.check --prefix "$prefix" \
    --json-file "$out_dir/envcheck.json"
  echo "gpu_check: envcheck exit $?"
  set -e
else
  echo "gpu_check: no GPU (or --dry-run): bin/envcheck's GPU checks not run"
fi

cd "$root"
exec timeout 360 "$python" bench/gpu_check.py --out "$out_dir/gpu_check.json" "${dry[@]}"
