#!/usr/bin/env bash
# Builds the dashboard (ui/) into gpufleet/ui/static/, which is committed: installing gpufleet
# needs no Node.js. Run after changing anything under ui/ and commit the result.
set -euo pipefail
cd "$(dirname "$0")/../ui"
npm ci --no-audit --no-fund
out=../gpufleet/ui/static
rm -rf "$out" && mkdir -p "$out"
cp index.html "$out/"
# app.js is the page; what only some views need (uPlot, for the charts) is a chunk loaded by them.
./node_modules/.bin/esbuild app=src/main.jsx --bundle --minify --format=esm --target=es2020 --splitting \
  --chunk-names='chunk-[hash]' --jsx=automatic --jsx-import-source=preact --legal-comments=none --outdir="$out"
ls -l "$out"
