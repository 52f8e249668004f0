set -u  # the call that found the compile: from the tree root, .whl carried
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
bash .whl/install.sh > $OUT/install.log 2>&1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
export TORCHINDUCTOR_CACHE_DIR=/tmp/ind TRITON_CACHE_DIR=/tmp/tri
L=$OUT/startup.log
t() { local s=$SECONDS; "$@"; echo "   ($1... wall $((SECONDS-s)) s)"; }
{
echo "== imports cold"; t python3 -X importtime results/2026-12-02-h200-0.8b-bytecode/startup_probe.py --imports 2> $OUT/imp_cold.txt
echo "== imports warm"; t python3 -X importtime results/2026-12-02-h200-0.8b-bytecode/startup_probe.py --imports 2> $OUT/imp_warm.txt
echo "== bare interpreter"; t python3 -c "import zmq"
echo "== build cold"; t timeout 200 python3 results/2026-12-02-h200-0.8b-bytecode/startup_probe.py 2>&1 | grep -v "captured\|INFO" | tail -5
for i in 1 2; do echo "== build warm $i"; t timeout 100 python3 results/2026-12-02-h200-0.8b-bytecode/startup_probe.py 2>&1 | tail -3; done
echo "== build warm cprofile"; t timeout 150 python3 results/2026-12-02-h200-0.8b-bytecode/startup_probe.py --cprofile $OUT/cprofile.txt 2>&1 | tail -3
} > $L 2>&1
cat $L
