#!/usr/bin/env bash
# Generates the seed corpus for the fuzz targets (not committed):
#   fuzz/corpus/inspect_bytes/  real gzip tars: plain, sorted, pax, gnu long
#                               names, links, fifo, .context, truncated, junk
#   fuzz/corpus/inspect_tar/    random byte strings (arbitrary-encoded input)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bytes="$here/corpus/inspect_bytes"
structured="$here/corpus/inspect_tar"
mkdir -p "$bytes" "$structured"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

src="$work/src"
mkdir -p "$src/docs/deep/er" "$src/empty" "$src/$(printf 'd%.0s' {1..60})/$(printf 'e%.0s' {1..80})"
echo hello >"$src/docs/a.md"
printf '#!/bin/sh\necho hi\n' >"$src/run.sh"; chmod +x "$src/run.sh"
head -c 3000 /dev/urandom >"$src/docs/deep/er/blob.bin"
echo long >"$src/$(printf 'd%.0s' {1..60})/$(printf 'e%.0s' {1..80})/f.txt"

tar -czf "$bytes/plain.tgz" -C "$src" .
tar -czf "$bytes/sorted.tgz" --sort=name -C "$src" .
tar -czf "$bytes/pax.tgz" --format=pax -C "$src" .
tar -czf "$bytes/gnu.tgz" --format=gnu -C "$src" .
tar -czf "$bytes/v7.tgz" --format=v7 -C "$src" docs run.sh

links="$work/links"
mkdir -p "$links"
echo x >"$links/a"
ln -s a "$links/sym"
ln "$links/a" "$links/hard"
mkfifo "$links/fifo"
tar -czf "$bytes/links.tgz" -C "$links" .

ctx="$work/ctx"
mkdir -p "$ctx/knowledge"
echo '{"name":"demo","type":"workspace"}' >"$ctx/manifest.json"
echo notes >"$ctx/knowledge/n.md"
sum() { sha256sum "$1" | cut -d' ' -f1; }
printf '{"formatVersion":1,"algorithm":"sha256","files":{"manifest.json":"%s","knowledge/n.md":"%s"}}' \
  "$(sum "$ctx/manifest.json")" "$(sum "$ctx/knowledge/n.md")" >"$ctx/checksums.json"
tar -czf "$bytes/context.tgz" -C "$ctx" .

head -c 200 "$bytes/plain.tgz" >"$bytes/truncated.tgz"
{ cat "$bytes/plain.tgz"; echo junk; } >"$bytes/trailing.tgz"
gzip -c </dev/null >"$bytes/empty.tgz"

for i in $(seq 1 16); do
  head -c $((i * 97)) /dev/urandom >"$structured/random-$i"
done
echo "seed corpus: $(ls "$bytes" | wc -l) + $(ls "$structured" | wc -l) files under $here/corpus"
