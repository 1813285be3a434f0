#!/usr/bin/env bash
# Runs the NVRTC kernel sources of kernels-cuda/src/{rowops,kernels}.rs on
# the host, compiled as C++ with address and UB sanitizers, against double
# references: a check of index arithmetic, grid guards and out-of-bounds
# access for machines without a GPU (it does not replace the CUDA tests).
# Each kernel runs once per thread of the same 1024-thread-block grid the
# backend launches, serially (so atomics are plain adds).
# Needs g++ and python3. Usage: kernels-cuda/tools/nvrtc-host-check/run.sh
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
src="$here/../../src"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
for name in rowops kernels; do
    python3 - "$src/$name.rs" "$work/$name.cu.inc" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
m = re.search(r'const SOURCE: &str = r#"(.*?)"#;', text, re.S)
if not m:
    sys.exit(f"no SOURCE in {sys.argv[1]}")
open(sys.argv[2], "w").write(m.group(1))
PY
done
g++ -std=c++17 -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=all \
    -Wall -Wno-unused-function -I "$work" "$here/harness.cpp" -o "$work/harness"
"$work/harness"
