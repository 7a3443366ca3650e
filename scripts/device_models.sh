#!/usr/bin/env bash
# Issue 34, section 1: every model family token-exact against transformers on every CUDA attention
# backend. Runs on the lent GPU machine (its python3 has torch, transformers 5, safetensors, numpy;
# build-device/ holds the binaries from scripts/build_device.sh). For each family of FAMILIES:
#   1. scripts/hf_models.py make: a random-weight checkpoint of the published shape (Llama-3.2-1B,
#      Qwen3-0.6B, Gemma-2-2B, Gemma-3-1B text) with decisive greedy choices, in a temporary folder;
#   2. hf_models.py reference: transformers' float32 eager greedy tokens and logits, 4 prompts alone
#      (7, 33, 130, 517 tokens; Gemma-2: 7, 33, 517, 4133, past its 4096-token window), 64 steps;
#      with HF_BF16=1 (the default on the GPU) also transformers' own bfloat16 run, compared like
#      attnkit's: the yardstick of a bf16 implementation's error;
#   3. `attnkit generate` of the 4 prompts in one batch for each backend of BACKENDS and each mode of
#      MODES (eager; graph = --capture-sizes CAPTURE_SIZES, CUDA graphs of the decode steps), with
#      --output-json and --output-logits;
#   4. hf_models.py compare: one line per run, PASS/FAIL, tokens matched, max logit difference
#      against its tolerance, the reference's margin where a token diverges. A backend that selection
#      refuses for the family is "refused: <why>", not a failure.
# Writes $OUT/models/: summary.md (conditions and the table), results.jsonl, logs.tar.gz (every
# command's output). Stops starting runs after TIME_BUDGET seconds (default 400) and says so, so
# the summary is written inside one device call.
#
# DRY_RUN=1: the same flow on this CPU machine with --tiny models, attnkit --platform cpu,
# BACKENDS "REFERENCE VARLEN CSR_PLAN", eager only, ATTNKIT_BIN build-cpu/attnkit, no bf16 run:
#   DRY_RUN=1 PYTHON=/work/venv-hf/bin/python OUT=/tmp/dry scripts/device_models.sh
# Other settings: PYTHON (python3), ATTNKIT_BIN, STEPS (64), SEED (34), PROMPT_LENGTHS (7,33,130,517),
# GEMMA2_PROMPT_LENGTHS, RUN_TIMEOUT (seconds per attnkit run, 180), KEEP=1 keeps the temp folder.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

dry_run="${DRY_RUN:-0}"
python="${PYTHON:-python3}"
families="${FAMILIES:-llama qwen3 gemma2 gemma3}"
steps="${STEPS:-64}"
seed="${SEED:-34}"
budget="${TIME_BUDGET:-400}"
run_timeout="${RUN_TIMEOUT:-180}"
capture_sizes="${CAPTURE_SIZES:-1 2 4}"
if [[ "$dry_run" == 1 ]]; then
  attnkit="${ATTNKIT_BIN:-build-cpu/attnkit}"
  backends="${BACKENDS:-REFERENCE VARLEN CSR_PLAN}"
  modes="${MODES:-eager}"
  platform=cpu device=cpu size_flag=--tiny hf_bf16="${HF_BF16:-0}"
else
  attnkit="${ATTNKIT_BIN:-build-device/attnkit}"
  backends="${BACKENDS:-VARLEN FLASHINFER CUDNN GPU_REFERENCE}"
  modes="${MODES:-eager graph}"
  platform=cuda device=cuda size_flag= hf_bf16="${HF_BF16:-1}"
  # cuDNN's library for a CUDNN build; build-device/lib for OpenBLAS.
  source scripts/device_env.sh
fi
hf=scripts/hf_models.py
pairs=() prompt_args=()

out="${OUT:-/tmp/attnkit-models-out}/models"
mkdir -p "$out"
work="$(mktemp -d "${TMPDIR:-/tmp}/attnkit-models.XXXXXX")"
logs="$work/logs"
mkdir -p "$logs"
results="$work/results.jsonl"
: >"$results"
finish() {
  cp "$results" "$out/results.jsonl"
  tar czf "$out/logs.tar.gz" -C "$work" logs
  [[ "${KEEP:-0}" == 1 ]] && echo "kept $work" || rm -rf "$work"
}
trap finish EXIT

note() {  # family run verdict notes
  "$python" "$hf" note --label "$1" --run "$2" --verdict "$3" --notes "$4" --results "$results"
}

conditions() {
  echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  if [[ "$platform" == cuda ]]; then
    echo "gpu: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -1)"
  fi
  echo "python: $("$python" -c 'import sys, torch, transformers; print(sys.version.split()[0], "torch", torch.__version__, "transformers", transformers.__version__)' 2>&1 | tail -1)"
  local commit
  commit="$(cat "$(dirname "$attnkit")/COMMIT" 2>/dev/null || git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "attnkit: $attnkit, commit $commit"
  echo "platform $platform; families: $families; backends: $backends; modes: $modes (graph: --capture-sizes $capture_sizes); $steps steps, seed $seed"
}

# The reason a refusal gives: the "- [feature] ..." lines of the error, else its first line.
refusal_reason() {
  local reasons
  reasons="$(grep -E '^\s+- ' "$1" | sed -E 's/^\s+- //' | sort -u | paste -sd ';' | cut -c1-300)"
  [[ -n "$reasons" ]] && echo "$reasons" || grep -m1 'attnkit: error' "$1" | cut -c1-300
}

prompt_lengths() {
  if [[ "$1" == gemma2 && "$dry_run" != 1 ]]; then
    echo "${GEMMA2_PROMPT_LENGTHS:-7,33,517,4133}"
  else
    echo "${PROMPT_LENGTHS:-7,33,130,517}"
  fi
}

# One attnkit generate run; appends its output pair to the array `pairs` or notes why there is none.
run_attnkit() {  # family dir backend mode
  local family="$1" dir="$2" backend="$3" mode="$4" name="$3-$4"
  local log="$logs/$family-$name.log" extra=()
  [[ "$mode" == graph ]] && extra=(--capture-sizes $capture_sizes)
  local start=$SECONDS
  timeout "$run_timeout" "$attnkit" generate --model "$dir" --platform "$platform" --backend "$backend" \
    "${prompt_args[@]}" --max-tokens "$steps" --ignore-eos --output-json "$dir/runs/$name.json" \
    --output-logits "$dir/runs/$name.npy" "${extra[@]}" >"$log" 2>&1
  local rc=$?
  echo "  $family $name: exit $rc, $((SECONDS - start)) s" >>"$logs/timing.log"
  if [[ $rc == 0 ]]; then
    pairs+=("$dir/runs/$name.json" "$dir/runs/$name.npy")
  elif grep -q 'unknown attention backend' "$log"; then
    note "$family" "$name" "not built" "$(grep -m1 -o 'unknown attention backend.*' "$log" | cut -c1-200)"
  elif grep -q 'was requested explicitly but cannot run' "$log"; then
    note "$family" "$name" refused "$(refusal_reason "$log")"
  elif [[ $rc == 124 ]]; then
    note "$family" "$name" ERROR "timed out after $run_timeout s"
  else
    note "$family" "$name" ERROR "exit $rc: $(grep -v '^\s*$' "$log" | tail -1 | cut -c1-300)"
  fi
}

run_family() {  # family
  local family="$1" dir="$work/$1" start=$SECONDS
  local made=0 where
  # Initializing on the GPU is fast; should this transformers not manage it there, the CPU will do
  # (slower, other random numbers for the same seed).
  for where in $(printf '%s\n' "$device" cpu | uniq); do
    rm -rf "$dir"
    if "$python" "$hf" make "$dir" --family "$family" $size_flag --seed "$seed" --device "$where" \
        --prompt-lengths "$(prompt_lengths "$family")" >>"$logs/$family-make.log" 2>&1; then
      made=1
      break
    fi
  done
  if [[ $made != 1 ]]; then
    note "$family" make ERROR "$(tail -1 "$logs/$family-make.log" | cut -c1-300)"
    return
  fi
  grep '^made' "$logs/$family-make.log"
  mkdir -p "$dir/runs"
  local bf16=()
  [[ "$hf_bf16" == 1 ]] && bf16=(--bf16-run "$dir/runs/transformers-bf16")
  if ! "$python" "$hf" reference "$dir" --steps "$steps" --device "$device" "${bf16[@]}" \
      >"$logs/$family-reference.log" 2>&1; then
    note "$family" reference ERROR "$(tail -1 "$logs/$family-reference.log" | cut -c1-300)"
    rm -rf "$dir"
    return
  fi
  grep -E '^(reference|transformers)' "$logs/$family-reference.log"
  pairs=()
  [[ "$hf_bf16" == 1 ]] && pairs+=("$dir/runs/transformers-bf16.json" "$dir/runs/transformers-bf16.npy")
  prompt_args=()
  local ids
  while read -r ids; do prompt_args+=(--prompt-ids "$ids"); done < <(
    "$python" -c 'import json, sys; [print(",".join(map(str, p))) for p in json.load(open(sys.argv[1]))["prompts"]]' \
      "$dir/prompts.json")
  local backend mode
  for backend in $backends; do
    for mode in $modes; do
      if (( SECONDS > budget )); then
        note "$family" "$backend-$mode" skipped "time budget of $budget s spent"
        continue
      fi
      run_attnkit "$family" "$dir" "$backend" "$mode"
    done
  done
  if (( ${#pairs[@]} )); then
    "$python" "$hf" compare "$dir" "${pairs[@]}" --label "$family" --results "$results" 2>"$logs/$family-compare.log"
  fi
  echo "$family: $((SECONDS - start)) s"
  [[ "${KEEP:-0}" == 1 ]] || rm -rf "$dir"  # a full checkpoint is GBs and its logits files more
}

conditions | tee "$work/conditions.txt"
if [[ ! -x "$attnkit" ]]; then
  echo "device_models.sh: no attnkit binary at $attnkit (ATTNKIT_BIN)" >&2
  exit 1
fi
for family in $families; do
  if (( SECONDS > budget )); then
    note "$family" all skipped "time budget of $budget s spent"
    continue
  fi
  run_family "$family"
done
"$python" "$hf" summary "$results" "$out/summary.md" --conditions "$work/conditions.txt"
echo "total $SECONDS s; $out/summary.md"
! grep -qE '"verdict": "(FAIL|ERROR)"' "$results"
