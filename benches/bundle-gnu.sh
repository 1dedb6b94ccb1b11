#!/usr/bin/env bash
# Bundle engine throughput next to GNU tools, on the same inputs.
#
#   benches/bundle-gnu.sh            # from anywhere; takes ~3-4 minutes
#
# 1. Runs the criterion bench (benches/bundle.rs), which generates the inputs
#    (a) 10,000 x 1 KiB files and (b) 4 x 64 MiB mixed random/text files,
#    benchmarks `inspect` and `canonicalize`, and writes the inputs here.
# 2. Times `gzip -dc X | tar -t` and `tar -xzf X -C fresh_dir` (tmpfs when
#    /dev/shm exists: many-file extraction on ext4 is noise) on the same files,
#    median of 5 runs.
# 3. Prints every figure in MB/s of inflated input (10^6 bytes) and the ratios
#    against the targets: inspect >= 2x GNU listing, canonicalize >= 1x GNU
#    extraction, on (b).
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"
target="${CARGO_TARGET_DIR:-$repo/target}"
work="$(mktemp -d)"
scratch_root=/dev/shm
[ -d "$scratch_root" ] && [ -w "$scratch_root" ] || scratch_root="$work"
trap 'rm -rf "$work" "$scratch_root"/bundle-gnu-x.*' EXIT

export BUNDLE_BENCH_DIR="$work"
log="${TMPDIR:-/tmp}/bundle-criterion.log"
if ! cargo bench --bench bundle -- --noplot >"$log" 2>&1; then
  tail -n 30 "$log"
  echo "criterion bench failed; full log in $log" >&2
  exit 1
fi
grep -E "^[a-z_]+/|thrpt|time:" "$log"

python3 - "$work" "$target" "$scratch_root" <<'PY'
import json, os, shutil, statistics, subprocess, sys, tempfile, time
work, target, scratch_root = sys.argv[1:4]

def crit(group, fn):
    path = os.path.join(target, "criterion", group, fn, "new", "estimates.json")
    if not os.path.exists(path):
        print(f"missing criterion estimate {path}", file=sys.stderr)
        return float("nan")
    with open(path) as f:
        return json.load(f)["median"]["point_estimate"] / 1e9  # seconds

def timed(cmd, setup=None, runs=5):
    secs = []
    for _ in range(runs):
        arg = setup() if setup else None
        t = time.perf_counter()
        subprocess.run(cmd(arg) if setup else cmd, shell=True, check=True)
        secs.append(time.perf_counter() - t)
        if arg:
            shutil.rmtree(arg)
    return statistics.median(secs)

rows = []
for name in ["a_small_files", "b_large_files", "b_large_files_unsorted"]:
    path = os.path.join(work, f"{name}.tar.gz")
    inflated = int(open(os.path.join(work, f"{name}.inflated")).read())
    compressed = os.path.getsize(path)
    mbs = lambda s: inflated / s / 1e6
    ins = mbs(crit(name, "inspect"))
    can = mbs(crit(name, "canonicalize"))
    lst = mbs(timed(f"gzip -dc '{path}' | tar -t >/dev/null"))
    fresh = lambda: tempfile.mkdtemp(prefix="bundle-gnu-x.", dir=scratch_root)
    ext = mbs(timed(lambda d: f"tar -xzf '{path}' -C '{d}'", setup=fresh))
    rows.append((name, inflated, compressed, ins, can, lst, ext))

print()
print(f"{'input':<24}{'inflated MB':>12}{'gz MB':>8}{'inspect':>9}{'canon.':>9}{'gnu -t':>9}{'gnu -x':>9}{'insp/-t':>9}{'canon/-x':>9}")
for name, inflated, compressed, ins, can, lst, ext in rows:
    print(f"{name:<24}{inflated/1e6:>12.1f}{compressed/1e6:>8.1f}{ins:>9.0f}{can:>9.0f}{lst:>9.0f}{ext:>9.0f}{ins/lst:>9.2f}{can/ext:>9.2f}")
print("(MB/s of inflated input; criterion medians; GNU medians of 5 runs; extraction into", scratch_root + ")")
b = rows[1]
print(f"targets on (b): inspect/listing {b[3]/b[5]:.2f} (target >= 2), canonicalize/extraction {b[4]/b[6]:.2f} (target >= 1)")
PY
