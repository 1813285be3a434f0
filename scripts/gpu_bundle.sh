#!/usr/bin/env bash
# Build everything a GPU session runs, here (the GPU machine has no Rust toolchain and no
# network), into .gpu/ (git-ignored through .git/info/exclude), with .gpu/run.sh to run there:
#
#   bash scripts/gpu_bundle.sh            # here: release builds, stripped into .gpu/
#   bash .gpu/run.sh [what...]            # on the GPU machine, from the repository root
#
# run.sh's parts (all by default): tests (every CUDA/NCCL test binary), train (the CLI on
# cuda:0, f32/tf32/bf16), calibrate (`plan --calibrate --device cuda`), bench (gpu_train,
# the 118M GPT per precision), torch (scripts/torch_gpt_bench.py beside it), ncu (per-kernel
# times of one bf16 microbatch step). It prints summaries to stdout and copies files to $OUT if set.
set -euo pipefail
cd "$(dirname "$0")/.."
out=.gpu
rm -rf "$out" && mkdir -p "$out/bin"
exclude="$(git rev-parse --git-path info/exclude)"
mkdir -p "$(dirname "$exclude")"
grep -qx '.gpu/' "$exclude" 2>/dev/null || echo '.gpu/' >>"$exclude"

# `cargo test --no-run` of one package's targets: each test binary, stripped, named after
# its target.
tests() {
  local pkg=$1 feats=$2; shift 2
  cargo test --release -p "$pkg" --features "$feats" "$@" --no-run --message-format=json 2>/dev/null |
    python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print(m["target"]["name"], m["executable"])' |
    while read -r name exe; do strip -o "$out/bin/$pkg-$name" "$exe"; echo "  $pkg-$name"; done
}
echo "test binaries:"
tests pipewright-kernels-cuda cuda --lib
tests pipewright-kernels cuda --test it --test backends --test stage_backends
tests pipewright-comm "nccl mpi" --lib
tests pipewright-runtime "nccl mpi" --lib --test cuda --test nccl --test gpu_gpt
echo "pipewright (cuda nccl mpi) and the gpu_train bench:"
cargo build --release --features "cuda nccl mpi" 2>/dev/null
strip -o "$out/bin/pipewright" target/release/pipewright
bench=$(cargo bench --features cuda --bench gpu_train --no-run --message-format=json 2>/dev/null |
  python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable"):
        print(m["executable"])' | tail -1)
strip -o "$out/bin/gpu_train" "$bench"
cp scripts/torch_gpt_bench.py "$out/"

cat >"$out/run.sh" <<'RUN'
#!/usr/bin/env bash
# On the GPU machine, from the repository root: bash .gpu/run.sh [tests train calibrate bench torch ncu]
set -uo pipefail
mkdir -p /tmp/lib
ln -sf /usr/lib/x86_64-linux-gnu/libnccl.so.2 /tmp/lib/libnccl.so
export LD_LIBRARY_PATH=/tmp/lib:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib:/usr/lib/x86_64-linux-gnu
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
bin=.gpu/bin
parts=${*:-tests train calibrate bench torch ncu}
out=${OUT:-/tmp/gpu-out}; mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
has() { [[ " $parts " == *" $1 "* ]]; }
if has tests; then
  for t in "$bin"/pipewright-kernels-* "$bin"/pipewright-comm-* "$bin"/pipewright-runtime-*; do
    echo "== $(basename "$t")"
    "$t" --test-threads=1 2>&1 | grep -E "^test |test result|skipped|panicked|FAILED" | tail -40
  done
fi
if has train; then
  for p in f32 tf32 bf16; do
    echo "== train --device cuda:0 --precision $p"
    "$bin/pipewright" train --device cuda:0 --precision "$p" --stages 2 --microbatches 8 --steps 20 2>&1 | tail -4
  done
fi
if has calibrate; then
  echo "== plan --calibrate --device cuda --cluster h100-80g"
  "$bin/pipewright" plan --calibrate "$out/h100-local.json" --device cuda --cluster h100-80g 2>&1
fi
if has bench; then
  echo "== gpu_train bench"
  "$bin/gpu_train" --bench 2>&1 | grep -vE "^(Benchmarking|Warming)" | tail -30
fi
if has torch; then
  echo "== PyTorch beside it"
  python3 .gpu/torch_gpt_bench.py 2>&1 | tail -12
fi
if has ncu && command -v ncu >/dev/null; then
  echo "== ncu, one bf16 step of the 118M GPT (per-kernel gpu__time_duration.sum)"
  ncu --metrics gpu__time_duration.sum --print-summary per-kernel --csv \
    "$bin/pipewright" train --device cuda:0 --precision bf16 --stages 1 --microbatches 1 --steps 1 \
    --vocab 8192 --seq-len 256 --d-model 1024 --heads 16 --layers 8 --microbatch-size 8 >"$out/ncu.csv" 2>&1
  tail -40 "$out/ncu.csv"
fi
RUN
chmod +x "$out/run.sh"
du -sh "$out"
echo "carry .gpu to the device machine (run tool: carry [\".gpu\"]), then: bash .gpu/run.sh"
