#!/bin/bash
# Check GUIDE.md's training example as a user's crate would build it: its first Rust block
# as `src/main.rs`, on the dependency line GUIDE.md gives it (`pipewright = { version = "0.1",
# ... }`, with a path to this tree). The doctest runs the same code on the default features;
# this checks that the features GUIDE.md names are enough.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
. "$repo/scripts/guide.sh"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
keys=$(guide_keys "$repo")
[ -n "$keys" ] || { echo "error: GUIDE.md has no 'pipewright = { version = \"0.1\", ... }' line" >&2; exit 1; }
mkdir -p "$dir/src"
guide_main "$repo" > "$dir/src/main.rs"
printf '[package]\nname = "guide-example"\nversion = "0.1.0"\nedition = "2021"\n\n[dependencies]\npipewright = { path = "%s"%s }\n\n[workspace]\n' "$repo" "$keys" > "$dir/Cargo.toml"
CARGO_TARGET_DIR="$repo/target/guide-example" cargo check --quiet --manifest-path "$dir/Cargo.toml"
echo "GUIDE.md's example builds on$keys"
