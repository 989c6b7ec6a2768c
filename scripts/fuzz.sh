#!/usr/bin/env bash
# Longer fuzzing on demand. The short deterministic run is part of `cargo test`
# (tests/fuzz_targets.rs); this runs every target (or the named ones) for SECONDS each.
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]        # default 60 s per target, all targets
#
# Engine (APF_FUZZ_ENGINE):
#   auto (default)  libFuzzer via `cargo fuzz` when cargo-fuzz is installed, else builtin
#   libfuzzer       `RUSTC_BOOTSTRAP=1 cargo fuzz run -O -a` (debug assertions: overflow checks) (stable toolchain; needs cargo-fuzz:
#                   `cargo install cargo-fuzz --locked`). New inputs go to fuzz/corpus-work/<t>
#                   (git-ignored); crashes to fuzz/artifacts/<t>/.
#   builtin         the in-repo mutation fuzzer, `cargo test --test fuzz_targets` with
#                   APF_FUZZ_SECS; the seed is random unless APF_FUZZ_SEED is set (printed).
# Both stop at the first failing target and exit non-zero.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

secs="${1:-60}"
[[ "$secs" =~ ^[0-9]+$ ]] || { echo "usage: $0 [SECONDS] [TARGET...]" >&2; exit 2; }
shift || true
targets=("$@")
if [[ ${#targets[@]} -eq 0 ]]; then
  mapfile -t targets < <(ls fuzz/fuzz_targets | sed -n 's/\.rs$//p')
fi

engine="${APF_FUZZ_ENGINE:-auto}"
if [[ "$engine" == auto ]]; then
  if cargo fuzz --version >/dev/null 2>&1; then engine=libfuzzer; else engine=builtin; fi
fi

case "$engine" in
  libfuzzer)
    export RUSTC_BOOTSTRAP=1
    for t in "${targets[@]}"; do
      echo "==> [fuzz.sh] libFuzzer $t for ${secs}s"
      mkdir -p "fuzz/corpus-work/$t"
      (cd fuzz && cargo fuzz run -O -a "$t" "corpus-work/$t" "corpus/$t" -- \
        -max_total_time="$secs" -timeout=20 -rss_limit_mb=2048 -malloc_limit_mb=1024 -print_final_stats=1)
    done
    echo "fuzz.sh: done; to keep interesting new inputs: (cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz cmin -O TARGET corpus-work/TARGET)"
    ;;
  builtin)
    export APF_FUZZ_SECS="$secs"
    export APF_FUZZ_SEED="${APF_FUZZ_SEED:-$(( (RANDOM << 16) ^ RANDOM ^ $(date +%s) ))}"
    echo "==> [fuzz.sh] builtin fuzzer, ${secs}s per target, APF_FUZZ_SEED=$APF_FUZZ_SEED"
    for t in "${targets[@]}"; do
      cargo test --test fuzz_targets -- --exact "fuzz_$t" --nocapture --test-threads=1
    done
    ;;
  *)
    echo "fuzz.sh: unknown APF_FUZZ_ENGINE=$engine (auto, libfuzzer, builtin)" >&2
    exit 2
    ;;
esac
