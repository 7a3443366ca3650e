#!/usr/bin/env bash
# The main job: builds the CLI (scripts/build_cli.sh: the CUDA one where a GPU is usable, else the
# CPU-only one, which a fresh 2-core machine builds in minutes), makes a small random-weight model
# of a real architecture (Gemma-3's: sliding-window and global layers, so two KV-cache groups) and
# generates from it through the attention layer, on the GPU when there is one, else on the CPU. Prints the selection log, the
# tokens and where each step's time went. Arguments go to `attnkit generate` (e.g. --backend
# REFERENCE, --temperature 0.8 --seed 3); FAMILY=llama|qwen2|qwen3|mistral|gemma2|gemma3 and
# SIZE=tiny|small choose the model. Build output goes to stderr.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

dir="$(./scripts/build_cli.sh)"

family="${FAMILY:-gemma3}"
size="${SIZE:-small}"
model="$dir/models/${family}-${size}"
if [[ ! -f "$model/config.json" ]]; then
  "$dir/attnkit" make-model --family "$family" --size "$size" --seed 1 "$model" >&2
fi
exec "$dir/attnkit" generate --model "$model" --prompt-ids "2,17,301,44,9,1021,5,77" \
  --prompt-ids "2,8,600,12" --prompt-ids "2,400,401,402,403,404,405,406,407,408,409,410" \
  --max-tokens 24 --ignore-eos "$@"
