#!/bin/bash
# Build times of two trees in one run (issue 34's ratios): a user's crate that depends on the
# façade, built cold in release, then the README's test command from a cold target.
# Usage: scripts/build_times.sh OLD_REV NEW_REV (both checked out under /tmp/libbench).
set -u
old_rev=${1:?old revision} new_rev=${2:?new revision}
repo=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p /tmp/libbench && cd /tmp/libbench
for v in old new; do
  rev=$old_rev; [ "$v" = new ] && rev=$new_rev
  [ -d "$v" ] || git -C "$repo" worktree add -q "/tmp/libbench/$v" "$rev"
  mkdir -p "user-$v/src"
  printf '[package]\nname = "user-%s"\nversion = "0.1.0"\nedition = "2021"\n\n[dependencies]\npipewright = { path = "../%s" }\n\n[workspace]\n' "$v" "$v" > "user-$v/Cargo.toml"
  printf 'use pipewright::schedule::{generate, ScheduleKind, ScheduleSpec};\nfn main() {\n    let tt = generate(&ScheduleSpec::new(ScheduleKind::OneFOneB, 4, 1, 8, None).unwrap());\n    println!("{}", tt.num_devices());\n}\n' > "user-$v/src/main.rs"
done
for v in old new; do
  rm -rf target-$v
  start=$(date +%s.%N)
  (cd user-$v && CARGO_TARGET_DIR=/tmp/libbench/target-$v cargo build --release --offline -q 2>&1 | tail -2)
  end=$(date +%s.%N)
  n=$(ls target-$v/release/deps/*.rlib 2>/dev/null | wc -l)
  clap=$(ls target-$v/release/deps/ | grep -c '^libclap')
  echo "$v: $(echo "$end - $start" | bc) s, $n rlibs, clap rlibs: $clap, load: $(cut -d' ' -f1-3 /proc/loadavg)"
done
# The README's test command from a cold target, old tree then new.
for v in old new; do
  rm -rf /tmp/libbench/ttarget-$v
  start=$(date +%s.%N)
  (cd /tmp/libbench/$v && CARGO_TARGET_DIR=/tmp/libbench/ttarget-$v cargo test --workspace --offline -q > /tmp/libbench/test-$v.log 2>&1; echo "rc=$?" >> /tmp/libbench/test-$v.log)
  end=$(date +%s.%N)
  bins=$(grep -c 'Running' /tmp/libbench/test-$v.log)
  echo "test $v: $(echo "$end - $start" | bc) s, $(tail -1 /tmp/libbench/test-$v.log), load: $(cut -d' ' -f1-3 /proc/loadavg)"
  rm -rf /tmp/libbench/ttarget-$v
done
