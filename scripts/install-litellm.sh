#!/usr/bin/env bash
# LiteLLM's proxy, the peer in bench/proxy_overhead.py, in its own virtualenv under the gitignored .build/:
# its many pinned dependencies must not change the versions Velo and its tests run with.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .build/litellm/bin/litellm ]; then
  python3 -m venv .build/litellm
  .build/litellm/bin/pip install -q 'litellm[proxy]'
fi
echo "$PWD/.build/litellm/bin/litellm"
