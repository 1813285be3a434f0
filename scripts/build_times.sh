#!/bin/bash
# Build times of two trees in one run (issue 34's ratios). Each user crate is built cold in
# release, old tree then new, alternating, so both see the same load:
#   schedule: a crate that generates a timetable, on the façade's default features;
#   lean:     the same crate with `default-features = false` (new tree only);
#   guide:    GUIDE.md's first Rust example (train a model, draw its chart): the old tree on
#             default features, the new one on the features GUIDE.md gives it, and again
#             on default features (guide-default-new).
# Then, with `tests` as third argument, the README's test command from a cold target.
# Usage: scripts/build_times.sh OLD_REV NEW_REV [tests] (both checked out under /tmp/libbench).
set -u
old_rev=${1:?old revision} new_rev=${2:?new revision} tests=${3:-}
repo=$(cd "$(dirname "$0")/.." && pwd)
. "$repo/scripts/guide.sh"
mkdir -p /tmp/libbench && cd /tmp/libbench
guide_main "$repo" > guide_main.rs
guide_keys=$(guide_keys "$repo")
schedule_main='use pipewright::schedule::{generate, ScheduleKind, ScheduleSpec};
fn main() {
    let tt = generate(&ScheduleSpec::new(ScheduleKind::OneFOneB, 4, 1, 8, None).unwrap());
    println!("{}", tt.num_devices());
}'
user() { # name tree extra-dependency-keys main-file-or-text
  mkdir -p "$1/src"
  printf '[package]\nname = "%s"\nversion = "0.1.0"\nedition = "2021"\n\n[dependencies]\npipewright = { path = "../%s"%s }\n\n[workspace]\n' "$1" "$2" "$3" > "$1/Cargo.toml"
  if [ -f "$4" ]; then cp "$4" "$1/src/main.rs"; else printf '%s\n' "$4" > "$1/src/main.rs"; fi
}
for v in old new; do
  rev=$old_rev; [ "$v" = new ] && rev=$new_rev
  if [ -d "$v" ]; then git -C "$v" checkout -q --detach "$rev"; else git -C "$repo" worktree add -q "/tmp/libbench/$v" "$rev"; fi
  user "schedule-$v" "$v" "" "$schedule_main"
done
user guide-old old "" guide_main.rs
user guide-new new "$guide_keys" guide_main.rs
user guide-default-new new "" guide_main.rs
user lean-new new ", default-features = false" "$schedule_main"
build() {
  rm -rf "target-$1"
  start=$(date +%s.%N)
  (cd "$1" && CARGO_TARGET_DIR="/tmp/libbench/target-$1" cargo build --release --offline -q 2>&1 | tail -2)
  end=$(date +%s.%N)
  n=$(ls "target-$1"/release/deps/*.rlib 2>/dev/null | wc -l)
  clap=$(ls "target-$1"/release/deps/ | grep -c '^libclap')
  echo "$1: $(echo "$end - $start" | bc) s, $n rlibs, clap rlibs: $clap, load: $(cut -d' ' -f1-3 /proc/loadavg)"
  rm -rf "target-$1"
}
for u in schedule-old schedule-new lean-new guide-old guide-new guide-default-new; do build "$u"; done
[ "$tests" = tests ] || exit 0
# The README's test command from a cold target, old tree then new.
for v in old new; do
  rm -rf /tmp/libbench/ttarget-$v
  start=$(date +%s.%N)
  (cd /tmp/libbench/$v && CARGO_TARGET_DIR=/tmp/libbench/ttarget-$v cargo test --workspace --offline -q > /tmp/libbench/test-$v.log 2>&1; echo "rc=$?" >> /tmp/libbench/test-$v.log)
  end=$(date +%s.%N)
  echo "test $v: $(echo "$end - $start" | bc) s, $(tail -1 /tmp/libbench/test-$v.log), load: $(cut -d' ' -f1-3 /proc/loadavg)"
  rm -rf /tmp/libbench/ttarget-$v
done
