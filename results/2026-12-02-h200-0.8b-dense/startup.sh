#!/usr/bin/env bash
# three start-ups: all cold; fresh Inductor with a warm Triton cache; both warm
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
[ -d /tmp/site/flashinfer ] || bash .whl/install.sh > "$OUT/install.log" 2>&1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 TRITON_PRINT_AUTOTUNING=1 TORCH_LOGS=recompiles
export TRITON_CACHE_DIR=/tmp/tri
for run in cold:/tmp/ind1 newround:/tmp/ind2 warm:/tmp/ind2; do
  name=${run%%:*}; export TORCHINDUCTOR_CACHE_DIR=${run#*:}
  s=$SECONDS; timeout 250 python3 results/2026-12-02-h200-0.8b-dense/startup.py > "$OUT/startup-$name.log" 2>&1
  echo "== $name exit $? in $((SECONDS - s)) s"; grep -E "TOTAL|SPENT" "$OUT/startup-$name.log"
done
