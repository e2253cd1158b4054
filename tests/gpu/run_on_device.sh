#!/usr/bin/env bash
# The GPU checks in one prepared script: `nanscope repro`, the GPU tier (`pytest -m gpu`) and the benchmarks with
# --device cuda, on a lent GPU machine (docs/testing.md, "The GPU tier").
#
# Here, in the repository's root, once (network to PyPI, ../shared beside the checkout):
#     bash tests/gpu/run_on_device.sh --prepare
# fills the git-ignored .device/ (about 25 MB): .device/megatron-lm/megatron (Megatron-LM core_v0.15.0rc0's
# megatron/ package, core and training: megatron-core is not on the GPU image), .device/slime-src/<release>
# (slime's checkouts, NANSCOPE_SLIME_SRC) and .device/whl (wheels for Python 3.12 x86_64 of what nanscope needs
# and the image lacks: tree-sitter, tree-sitter-bash). Then, through the device tool:
#     run(command="bash tests/gpu/run_on_device.sh", carry=[".device"], timeout_s=600)
# The machine (nvidia-h200): Python 3.12 with torch 2.11.0+cu130, no TransformerEngine, no apex, no network; the
# checkout travels, ../shared does not. nanscope runs from src/ on PYTHONPATH (no install), megatron from .device.
# The image's numpy is 2.x, which megatron-core 0.15's metadata refuses (numpy<2); nothing the tier runs reaches the
# numpy-1 calls that pin is for (np.product in dist_checkpointing: checkpoint saving).
# Stages (default: all, in this order), each bounded by `timeout` so that all end inside one 600 s call:
#     repro   nanscope repro (the default matrix) as a user runs it, CUDA visible               90 s
#     gpu     pytest -m gpu tests/gpu: every scenario, its JSON kept                           420 s
#     bench   benchmarks/loss_overhead.py and plugin_overhead.py --device cuda               2 x 40 s
# e.g. `bash tests/gpu/run_on_device.sh gpu` for the tier alone. What comes back, under $OUT (3 files):
#     log.txt (the machine, each stage's output and exit code), scenarios.tgz (each scenario's JSON with the
#     machine's facts and the shims applied), benchmarks.txt.
set -u

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
DEVICE="$ROOT/.device"

prepare() {
    local shared="$ROOT/../shared"
    [ -d "$shared/megatron-lm/core_v0.15.0rc0/megatron" ] || { echo "no $shared/megatron-lm/core_v0.15.0rc0" >&2; exit 2; }
    rm -rf "$DEVICE" && mkdir -p "$DEVICE/megatron-lm" "$DEVICE/slime-src" "$DEVICE/whl"
    cp -r "$shared/megatron-lm/core_v0.15.0rc0/megatron" "$DEVICE/megatron-lm/"
    for release in v0.1.0 v0.2.4 v0.3.1 main; do
        [ -d "$shared/slime-src/$release" ] && cp -r "$shared/slime-src/$release" "$DEVICE/slime-src/"
    done
    python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d "$DEVICE/whl" "tree-sitter==0.26.1" "tree-sitter-bash==0.25.1" || exit 1
    find "$DEVICE" -name __pycache__ -prune -exec rm -rf {} +
    du -sh "$DEVICE"
}

if [ "${1:-}" = "--prepare" ]; then
    prepare
    exit 0
fi

[ -d "$DEVICE/megatron-lm/megatron" ] || { echo "no .device/ (run --prepare here first, carry .device)" >&2; exit 2; }
OUT=${OUT:-$ROOT/out/device}
mkdir -p "$OUT"
STAGES=${*:-repro gpu bench}
LOG="$OUT/log.txt"
SCENARIOS=$(mktemp -d)

# nanscope and megatron from the checkout, the wheels into a folder of their own; nothing installed system-wide
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/nanscope-site \
    "$DEVICE"/whl/*.whl >>"$LOG" 2>&1
export PYTHONPATH="$ROOT/src:$DEVICE/megatron-lm:/tmp/nanscope-site:$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export NANSCOPE_SLIME_SRC="$DEVICE/slime-src" NANSCOPE_TEST_MEGATRON_LM_SRC="$DEVICE/megatron-lm"
export NANSCOPE_TEST_GPU_OUT="$SCENARIOS" PYTHONUNBUFFERED=1
cd "$ROOT" || exit 2

stage() {  # NAME SECONDS COMMAND...: one stage's output and exit code into the log
    local name=$1 seconds=$2
    shift 2
    echo "=== $name: $* (at most $seconds s)" >>"$LOG"
    local started=$SECONDS
    timeout "$seconds" "$@" >>"$LOG" 2>&1
    echo "=== $name: exit $? after $((SECONDS - started)) s" >>"$LOG"
}

{
    echo "=== machine"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
    python3 -c "import sys, torch; print(sys.version.split()[0], torch.__version__, torch.version.cuda, torch.cuda.is_available())"
    python3 -c "import importlib.util as u; print('transformer_engine', u.find_spec('transformer_engine') is not None, 'apex', u.find_spec('apex') is not None)"
    nproc
} >>"$LOG" 2>&1

for s in $STAGES; do
    case $s in
        repro) stage repro 90 python3 -m nanscope.cli.main repro --json "$SCENARIOS/repro.json" ;;
        gpu) stage gpu 420 python3 -m pytest -m gpu tests/gpu -p no:cacheprovider -q -rA ;;
        bench)
            {
                stage loss_overhead 40 python3 benchmarks/loss_overhead.py --device cuda
                stage plugin_overhead 40 python3 benchmarks/plugin_overhead.py --device cuda
            }
            grep -A200 "=== loss_overhead" "$LOG" >"$OUT/benchmarks.txt"
            ;;
        *) echo "unknown stage $s (repro, gpu, bench)" >>"$LOG" ;;
    esac
done
tar -czf "$OUT/scenarios.tgz" -C "$SCENARIOS" . 2>>"$LOG"
tail -40 "$LOG"
