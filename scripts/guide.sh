# GUIDE.md's training example as a user's crate sees it, for scripts/guide_example.sh and
# scripts/build_times.sh (sourced; both read it from the GUIDE.md of the tree they run in).

# The example's code: GUIDE.md's first Rust block.
guide_main() { # REPO
  awk '/^```rust/{n++; next} n==1 && /^```/{exit} n==1{print}' "$1/GUIDE.md"
}

# What GUIDE.md's `pipewright = { version = "0.1", ... }` line adds to the version, e.g. its
# features (empty when GUIDE.md has no such line).
guide_keys() { # REPO
  grep -m1 '^pipewright = { version = "0.1"' "$1/GUIDE.md" | sed 's/^pipewright = { version = "0.1"//; s/ }$//' || true
}
