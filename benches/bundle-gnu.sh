#!/usr/bin/env bash
# What the user runs, side by side with GNU tools on the same files, in one
# run. Every figure times a whole process (or a whole HTTP request), never a
# library call.
#
#   benches/bundle-gnu.sh           # RUNS=5 (median of RUNS), ~3-5 minutes
#
# Inputs (made here, deterministic): (a) 9,800 x 1 KiB files in 110
# directories; (b) 4 x 64 MiB files alternating 1 MiB of random bytes and
# 1 MiB of text. Each is archived twice: as GNU `tar -czf` writes it, and
# canonically (`contextctl bundle pack`, what `contextctl workload upload`
# sends).
#
# 1. inspect: `contextctl bundle inspect FILE` vs `gzip -dc FILE | tar -t`
#    (target >= 2.0x on both inputs).
# 2. upload: `curl -T FILE` PUT until `201` (release service, data dir on
#    tmpfs) vs `tar -xzf FILE` into a fresh tmpfs directory (target >= 1.0x
#    for the GNU archive, >= 2.0x for the canonical one).
# 3. physical limits on the same bytes: zlib-rs inflate alone, sha256 alone,
#    loopback TCP copy (benches/bundle.rs).
# Ratios are GNU time / our time (> 1: we are faster). The 1-minute load
# average is printed beside each figure: on a busy machine the figures are
# noise, re-run on a quiet one.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"
RUNS="${RUNS:-5}"
# A free port unless told: a fixed one may be another service's.
PORT="${CS_PORT:-$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}"

need=()
for tool in curl tar gzip python3; do
  command -v "$tool" >/dev/null || need+=("$tool")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "installing ${need[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need[@]}" >/dev/null
fi

# BIN_DIR=dir: use the binaries already built there (and the limits
# program built by `cargo bench --bench bundle --no-run`).
if [ -z "${BIN_DIR:-}" ]; then
  echo "building release binaries..." >&2
  cargo build --release --quiet --bin contextctl --bin context-service
  cargo bench --quiet --bench bundle --no-run 2>/dev/null
fi
target="${BIN_DIR:-${CARGO_TARGET_DIR:-$repo/target}/release}"

# Everything on tmpfs when there is one: extraction of many small files on
# a disk file system measures the disk, not the tools.
scratch_root=/dev/shm
[ -d "$scratch_root" ] && [ -w "$scratch_root" ] || scratch_root="${TMPDIR:-/tmp}"
work="$(mktemp -d "$scratch_root/bundle-gnu.XXXXXX")"
CS_PID=""
cleanup() {
  [ -n "$CS_PID" ] && kill "$CS_PID" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

echo "making the inputs in $work..." >&2
python3 - "$work" <<'PY'
import os, random, sys
work = sys.argv[1]
rng = random.Random(12)
text_line = b"The quick brown fox jumps over the lazy dog; agents read context files. 0123456789\n"
def text(n):
    return (text_line * (n // len(text_line) + 1))[:n]
# (a) 9,800 x 1 KiB files in 110 directories (89 or 90 per directory).
a = os.path.join(work, "src-a")
for i in range(9800):
    d = os.path.join(a, f"d{i % 110:03}")
    os.makedirs(d, exist_ok=True)
    data = bytearray(text(1024))
    data[:8] = rng.randbytes(8)
    with open(os.path.join(d, f"f{i:05}.txt"), "wb") as f:
        f.write(data)
# (b) 4 x 64 MiB, alternating 1 MiB random and 1 MiB text.
b = os.path.join(work, "src-b")
os.makedirs(b)
mib = 1 << 20
for i in range(4):
    with open(os.path.join(b, f"part{i}.bin"), "wb") as f:
        for j in range(64):
            f.write(rng.randbytes(mib) if j % 2 == 0 else text(mib))
PY
for x in a b; do
  tar -czf "$work/$x.gnu.tar.gz" -C "$work/src-$x" .
  "$target/contextctl" bundle pack "$work/src-$x" -f "$work/$x.canonical.tar.gz" >/dev/null
done

# The service, on tmpfs like the extraction it is compared with.
export CS_DATA_DIR="$work/data"
URL="http://127.0.0.1:$PORT"
CS_LISTEN_ADDR="127.0.0.1:$PORT" RUST_LOG=warn "$target/context-service" serve \
  >"$work/service.log" 2>&1 &
CS_PID=$!
for _ in $(seq 1 100); do
  curl -fsS "$URL/healthz" >/dev/null 2>&1 && break
  sleep 0.1
done
if ! kill -0 "$CS_PID" 2>/dev/null; then
  echo "the service did not start:" >&2
  cat "$work/service.log" >&2
  exit 1
fi
ctl() { "$target/contextctl" --url "$URL" --data-dir "$CS_DATA_DIR" "$@"; }
TOKEN="$(ctl token)"
ctl workload create bench >/dev/null

echo "physical limits..." >&2
# LIMITS_BIN=path: the limits program when it was built elsewhere (it is
# built with the bench profile, whose dependencies are a build of their own).
limits_bin="${LIMITS_BIN:-$(ls -t "$target"/deps/bundle-* 2>/dev/null | grep -v '\.d$' | head -1 || true)}"
if [ -n "$limits_bin" ] && [ -x "$limits_bin" ]; then
  "$limits_bin" "$work/a.gnu.tar.gz" "$work/b.gnu.tar.gz" >"$work/limits.jsonl"
else
  echo "no limits program (cargo bench --bench bundle --no-run); skipping the limits" >&2
  : >"$work/limits.jsonl"
fi

python3 - "$work" "$target" "$URL" "$TOKEN" "$RUNS" "$scratch_root" <<'PY'
import json, os, shutil, statistics, subprocess, sys, tempfile, time
work, target, url, token, runs, scratch = sys.argv[1:7]
runs = int(runs)
ctl = os.path.join(target, "contextctl")

def load():
    return float(open("/proc/loadavg").read().split()[0])

def inflated(path):
    out = subprocess.run(f"gzip -dc '{path}' | wc -c", shell=True, check=True,
                         capture_output=True, text=True).stdout
    return int(out)

def run(cmd):
    subprocess.run(cmd, shell=True, check=True, stdout=subprocess.DEVNULL)

def put(path):
    code = subprocess.run(
        ["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "-T", path,
         "-H", "Expect:", "-H", "Content-Type: application/vnd.rossoctl.context",
         "-H", f"Authorization: Bearer {token}", f"{url}/v1/workloads/bench/bundle"],
        check=True, capture_output=True, text=True).stdout
    if code != "201":
        sys.exit(f"upload of {path} answered {code}")

def pair(ours, gnu, setup=None):
    """Median seconds of ours() and gnu(), interleaved so load drifts hit both."""
    a, b, loads = [], [], []
    for _ in range(runs):
        for f, acc in ((ours, a), (gnu, b)):
            arg = setup() if setup else None
            t = time.perf_counter()
            f(arg)
            acc.append(time.perf_counter() - t)
            if arg:
                shutil.rmtree(arg)
        loads.append(load())
    return statistics.median(a), statistics.median(b), statistics.median(loads)

inputs = [
    ("a: 9,800 x 1 KiB", "a"),
    ("b: 4 x 64 MiB mixed", "b"),
]
fresh = lambda: tempfile.mkdtemp(prefix="x.", dir=work)
head = f"{'input':<22}{'archive':<11}{'MB':>7}{'ours s':>9}{'GNU s':>9}{'ours MB/s':>11}{'GNU MB/s':>10}{'ratio':>7}{'target':>8}{'load':>6}"

def row(name, kind, mb, ours, gnu, target, ld):
    ratio = gnu / ours
    mark = "ok" if ratio >= target else "MISS"
    print(f"{name:<22}{kind:<11}{mb:>7.1f}{ours:>9.3f}{gnu:>9.3f}{mb/ours:>11.0f}{mb/gnu:>10.0f}"
          f"{ratio:>7.2f}{'>= %.1f' % target:>8}{ld:>6.1f}  {mark}")

print()
print(f"== inspect: `contextctl bundle inspect FILE` vs `gzip -dc FILE | tar -t` (median of {runs}, whole processes) ==")
print(head)
for name, x in inputs:
    for kind in ("gnu", "canonical"):
        path = os.path.join(work, f"{x}.{kind}.tar.gz")
        mb = inflated(path) / 1e6
        ours, gnu, ld = pair(lambda _: run(f"'{ctl}' bundle inspect '{path}'"),
                             lambda _: run(f"gzip -dc '{path}' | tar -t"))
        row(name, kind, mb, ours, gnu, 2.0, ld)

print()
print(f"== upload: PUT until 201 (curl -T, release service on {scratch}) vs `tar -xzf FILE` into a fresh {scratch} dir (median of {runs}) ==")
print(head)
for name, x in inputs:
    for kind, target_ratio in (("gnu", 1.0), ("canonical", 2.0)):
        path = os.path.join(work, f"{x}.{kind}.tar.gz")
        mb = inflated(path) / 1e6
        ours, gnu, ld = pair(lambda d: put(path),
                             lambda d: run(f"tar -xzf '{path}' -C '{d}'"), setup=fresh)
        row(name, kind, mb, ours, gnu, target_ratio, ld)

print()
print("== physical limits on the GNU archives (one core, MB/s of inflated bytes, median of 5) ==")
print(f"{'input':<22}{'zlib-rs inflate':>16}{'sha256':>9}{'loopback':>10}")
limits = open(os.path.join(work, "limits.jsonl")).read().splitlines()
if not limits:
    print("(not measured: the limits program was not built)")
for (name, _), line in zip(inputs, limits):
    l = json.loads(line)
    print(f"{name:<22}{l['inflate']:>16}{l['sha256']:>9}{l['loopback']:>10}")
print(f"(nproc {os.cpu_count()}, load average now {open('/proc/loadavg').read().split()[0]})")
PY
