#!/usr/bin/env bash
# What the user runs, side by side with GNU tools on the same files, in one
# run. Every figure times a whole process (or a whole HTTP request), never a
# library call.
#
#   benches/bundle-gnu.sh           # RUNS=5 (median of RUNS), ~3-5 minutes
#
# Inputs (made here, deterministic): (a) 9,800 x 1 KiB files in 110
# directories; (b) 4 x 64 MiB files alternating 1 MiB of random bytes and
# 1 MiB of text; (c) 9,800 x 1.5 KiB files in 110 directories, created in
# shuffled order (so GNU tar lists each directory shuffled; issue 37).
# Each is archived twice: as GNU `tar -czf` writes it, and canonically
# (`contextctl bundle pack`, what `contextctl workload upload` sends).
#
# 1. inspect: `contextctl bundle inspect FILE` vs `gzip -dc FILE | tar -t`
#    (target >= 2.0x on both inputs).
# 2. upload: `curl -T FILE` PUT until `201` (release service, data dir on
#    tmpfs) vs `tar -xzf FILE` into a fresh tmpfs directory (target >= 1.0x
#    for the GNU archive, >= 2.0x for the canonical one).
# 3. CPU (user + sys of whole processes, getrusage, median of CPU_RUNS,
#    default 15, interleaved) on (a) and (c): `contextctl bundle inspect`
#    vs `gzip -dc | tar -t` (target >= 2.0x), and the upload's work in one
#    process, `contextctl bundle inspect --bundle-digest` (validate,
#    canonicalise, recompress, as the service does) vs `tar -xzf` into a
#    fresh tmpfs directory (target >= 2.0x). BASE_BIN=path/contextctl adds
#    that build's figures in the same interleaved runs (a before/after).
# 4. physical limits on the same bytes: zlib-rs inflate alone, sha256 alone,
#    loopback TCP copy (benches/bundle.rs).
# Ratios are GNU time / our time (> 1: we are faster). The 1-minute load
# average is printed beside each figure: on a busy machine the figures are
# noise, re-run on a quiet one.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"
RUNS="${RUNS:-5}"
CPU_RUNS="${CPU_RUNS:-15}"
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
# (c) 9,800 x 1.5 KiB files in 110 directories, created in shuffled order.
c = os.path.join(work, "src-c")
order = list(range(9800))
rng.shuffle(order)
for i in order:
    d = os.path.join(c, f"d{i % 110:03}")
    os.makedirs(d, exist_ok=True)
    data = bytearray(text(1536))
    data[:8] = rng.randbytes(8)
    with open(os.path.join(d, f"f{i:05}.txt"), "wb") as f:
        f.write(data)
PY
for x in a b c; do
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

python3 - "$work" "$target" "$URL" "$TOKEN" "$RUNS" "$scratch_root" "$CPU_RUNS" "${BASE_BIN:-}" <<'PY'
import json, os, resource, shutil, statistics, subprocess, sys, tempfile, time
work, target, url, token, runs, scratch, cpu_runs, base = sys.argv[1:9]
runs, cpu_runs = int(runs), int(cpu_runs)
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
    ("c: 9,800 x 1.5 KiB", "c"),
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

def cpu(cmd):
    """CPU seconds (user + sys, every thread and child) of one whole run."""
    t = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    u = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (u.ru_utime - t.ru_utime) + (u.ru_stime - t.ru_stime)

def cpu_rows(title, cases, gnu_cmd, gnu_dir):
    """Median CPU of ours (and BASE_BIN's) and GNU's, interleaved."""
    print()
    print(title)
    print(f"{'input':<38}{'MB':>6}{'ours ms':>9}" + (f"{'base ms':>9}" if base else "")
          + f"{'GNU ms':>8}{'ratio':>7}" + (f"{'base':>6}" if base else "") + f"{'target':>8}{'load':>6}")
    for name, path, args in cases:
        mb = inflated(path) / 1e6
        sides = [[ctl]] + ([[base]] if base else [])
        times = [[] for _ in sides] + [[]]
        loads = []
        for _ in range(cpu_runs):
            for i, bin_ in enumerate(sides):
                times[i].append(cpu(bin_ + args(path)))
            d = tempfile.mkdtemp(prefix="x.", dir=work) if gnu_dir else None
            times[-1].append(cpu(["sh", "-c", gnu_cmd(path, d)]))
            if d:
                shutil.rmtree(d)
            loads.append(load())
        med = [statistics.median(t) * 1e3 for t in times]
        gnu = med[-1]
        ratio = gnu / med[0]
        line = f"{name:<38}{mb:>6.1f}{med[0]:>9.1f}" + (f"{med[1]:>9.1f}" if base else "")
        line += f"{gnu:>8.1f}{ratio:>7.2f}" + (f"{gnu / med[1]:>6.2f}" if base else "")
        line += f"{'>= 2.0':>8}{statistics.median(loads):>6.1f}  {'ok' if ratio >= 2.0 else 'MISS'}"
        print(line)

cpu_inputs = [(f"{name} {kind}", os.path.join(work, f"{x}.{kind}.tar.gz"))
              for name, x in (("a: 9,800 x 1 KiB", "a"), ("c: 9,800 x 1.5 KiB shuffled", "c"))
              for kind in ("gnu", "canonical")]
cpu_rows(f"== CPU of inspect: `contextctl bundle inspect FILE` vs `gzip -dc FILE | tar -t` "
         f"(user+sys, median of {cpu_runs}, interleaved) ==",
         [(n, p, lambda p: ["bundle", "inspect", p]) for n, p in cpu_inputs],
         lambda p, d: f"gzip -dc '{p}' | tar -t", False)
cpu_rows(f"== CPU of the upload's work: `contextctl bundle inspect --bundle-digest FILE` vs "
         f"`tar -xzf FILE` into a fresh {scratch} dir (user+sys, median of {cpu_runs}, interleaved) ==",
         [(n, p, lambda p: ["bundle", "inspect", "--bundle-digest", p]) for n, p in cpu_inputs],
         lambda p, d: f"tar -xzf '{p}' -C '{d}'", True)

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
