#!/usr/bin/env bash
# The GPU suite in one call: the cuda-marked tests, then the IG, TracIn, TRAK-featurize and Vision-BDH benchmarks
# with --device cuda, fp32 against AMP (bf16/fp16 autocast) where the benchmark has a reduced-precision path, every
# table written to one file under the results folder.
#
#   bash benchmarks/gpu_suite.sh            # on a GPU machine: CUDA torch installed, no network needed
#   bash benchmarks/gpu_suite.sh --smoke    # anywhere (CPU): tiny sizes, the same steps, to keep the script working
#
# Sized to finish within 8 minutes on one H100: each step has a time budget (SUITE_BUDGET_*; a step past it is
# stopped and its section says so) that adds up to 7.5 minutes. It needs torch (a CUDA build) and transformers on
# the machine already; everything else it needs is installed offline from the wheels in GPU_WHEELS
# (default: .gpu-wheels at the repository root, ignored by git), which `benchmarks/gpu_wheels.sh` fills on a
# machine with network access. The results file is RESULTS_DIR/gpu-suite-<UTC time>.md (default RESULTS_DIR:
# benchmarks/results); its first lines name the GPU, the driver, torch and CUDA.
#
# Settings (environment): PYTHON (default python3), GPU_WHEELS, RESULTS_DIR, SUITE_SMOKE=1 (same as --smoke),
# SUITE_SKIP_INSTALL=1 (use the packages already installed).
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
WHEELS="${GPU_WHEELS:-$ROOT/.gpu-wheels}"
RESULTS="${RESULTS_DIR:-$ROOT/benchmarks/results}"
SMOKE="${SUITE_SMOKE:-0}"
for arg in "$@"; do
  case "$arg" in
    --smoke) SMOKE=1 ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "gpu_suite.sh: unknown argument $arg (--smoke, --help)" >&2; exit 2 ;;
  esac
done

export PYTHONPATH="$ROOT:$ROOT/clients/python/src${PYTHONPATH:+:$PYTHONPATH}"
export EXPLAINQ_LOG_FORMAT=text PYTHONUNBUFFERED=1  # a step stopped at its budget keeps the rows it printed
WORK="$(mktemp -d -t explainq-gpu-suite-XXXXXX)"
trap 'rm -rf "$WORK"' EXIT

if [ "$SMOKE" = 1 ]; then
  DEVICE=cpu
  # seconds per step: tests, IG, TracIn, featurize, BDH fp32, BDH bf16
  BUDGETS=(300 600 600 600 600 600)  # generous: the smoke run checks the steps work, not their speed
else
  DEVICE=cuda
  BUDGETS=("${SUITE_BUDGET_TESTS:-90}" "${SUITE_BUDGET_IG:-120}" "${SUITE_BUDGET_TRACIN:-90}"
           "${SUITE_BUDGET_FEATURIZE:-60}" "${SUITE_BUDGET_BDH:-45}" "${SUITE_BUDGET_BDH:-45}")
fi

# ---- offline install of what the suite needs beyond torch and transformers
if [ "${SUITE_SKIP_INSTALL:-0}" != 1 ] && [ -f "$WHEELS/requirements.txt" ]; then
  echo "installing from $WHEELS (no network)"
  "$PY" -m pip install --quiet --no-index --find-links "$WHEELS" -r "$WHEELS/requirements.txt" || {
    echo "gpu_suite.sh: the offline install from $WHEELS failed" >&2; exit 1; }
elif [ "${SUITE_SKIP_INSTALL:-0}" != 1 ]; then
  echo "no $WHEELS/requirements.txt: using the packages already installed (fill it with benchmarks/gpu_wheels.sh)"
fi

if [ "$DEVICE" = cuda ] && ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "gpu_suite.sh: torch sees no CUDA device; run with --smoke on a machine without one" >&2
  exit 1
fi

mkdir -p "$RESULTS"
OUT="$RESULTS/gpu-suite-$(date -u +%Y%m%dT%H%M%SZ).md"
{
  echo "# explainq GPU suite ($([ "$SMOKE" = 1 ] && echo 'smoke run on CPU: tiny sizes, no GPU figures' || echo 'device cuda'))"
  echo
  echo "- date (UTC): $(date -u +%Y-%m-%dT%H:%M:%SZ); commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  "$PY" - <<'EOF'
import platform, torch
print(f"- torch {torch.__version__}, CUDA {torch.version.cuda}, Python {platform.python_version()}")
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print(f"- GPU: {p.name}, {p.total_memory / 2**30:.0f} GiB, compute capability {p.major}.{p.minor}, "
          f"{torch.cuda.device_count()} device(s)")
else:
    print("- GPU: none")
EOF
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader \
    | sed 's/^/- nvidia-smi: /'
  echo "- CPU: $(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores"
} > "$OUT"

FAILED=0
step() {  # step <n> <title> <command...>: the command's output, into its section, within its budget
  local budget="${BUDGETS[$1]}" title="$2"; shift 2
  local t0=$SECONDS rc
  printf '\n## %s\n\n```\n$ %s\n' "$title" "$*" >> "$OUT"
  echo "== $title (budget ${budget}s)"
  timeout --signal=TERM --kill-after=15 "$budget" "$@" > "$WORK/step.log" 2>&1
  rc=$?
  cat "$WORK/step.log" >> "$OUT"
  printf '```\n\n' >> "$OUT"
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    echo "**stopped after its budget of ${budget} s**: the rows above are what it printed by then." >> "$OUT"
    FAILED=1
  elif [ "$rc" != 0 ]; then
    echo "**exited with status $rc** after $((SECONDS - t0)) s." >> "$OUT"
    FAILED=1
  else
    echo "took $((SECONDS - t0)) s." >> "$OUT"
  fi
  tail -n 3 "$WORK/step.log"
}

# 1. the tests marked cuda (skipped, saying why, where there is no CUDA device), from the files that mark any
mapfile -t CUDA_TESTS < <(grep -rlE --include='test_*.py' 'mark\.cuda' tests | sort)
step 0 "cuda-marked tests" "$PY" -m pytest -q -p no:cacheprovider -m cuda -rs "${CUDA_TESTS[@]}"

# 2. IG: explainq against Captum (methods) and fp32 against bf16/fp16 autocast with completeness (precision)
if [ "$SMOKE" = 1 ]; then
  step 1 "IG against Captum, fp32 against AMP" "$PY" benchmarks/ig.py --device "$DEVICE" --quick --rounds 1 --history 5 \
    --sections methods,precision --home "$WORK/ig-home" --small "$WORK/ig-small" --threads 2
else
  step 1 "IG against Captum, fp32 against AMP" "$PY" benchmarks/ig.py --device "$DEVICE" --rounds 3 \
    --sections methods,precision --home "$WORK/ig-home" --small "$WORK/ig-small" --threads 8
fi

# 3. TracIn: explainq's rows on the GPU (fp32, then fp16 and bf16 autocast) against the loop and Captum
if [ "$SMOKE" = 1 ]; then
  step 2 "TracIn throughput, fp32 against AMP" "$PY" benchmarks/tracin.py --device "$DEVICE" --quick \
    --n-train 64 --n-test 2 --threads 2
else
  step 2 "TracIn throughput, fp32 against AMP" "$PY" benchmarks/tracin.py --device "$DEVICE" --n-test 64 \
    --ref-train 256 --threads 8
fi

# 4. TRAK featurize at FB15k-237 scale and the stored-feature query (fp32 features: no reduced-precision path)
if [ "$SMOKE" = 1 ]; then
  step 3 "TRAK featurize and query (fp32)" "$PY" benchmarks/featurize.py --device "$DEVICE" --train-triples 1000 \
    --repeats 1 --threads 2
else
  step 3 "TRAK featurize and query (fp32)" "$PY" benchmarks/featurize.py --device "$DEVICE" --threads 8
fi

# 5. Vision-BDH training step time, fp32 and bf16 autocast
for precision in fp32 bf16; do
  n=$([ "$precision" = fp32 ] && echo 4 || echo 5)
  if [ "$SMOKE" = 1 ]; then
    step "$n" "Vision-BDH step time, $precision" "$PY" benchmarks/bdh.py --device "$DEVICE" --quick \
      --precision "$precision" --rounds 1 --warmup 0 --steps 1 --compile off --no-shares --threads 2
  else
    step "$n" "Vision-BDH step time, $precision" "$PY" benchmarks/bdh.py --device "$DEVICE" \
      --precision "$precision" --rounds 2 --steps 5 --batch 128
  fi
done

echo "results: $OUT"
exit $FAILED
