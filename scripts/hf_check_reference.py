#!/usr/bin/env python3
"""Checks the model tests' dense reference (tests/model/hf_reference.cc) against transformers itself.

Not part of CI: it needs torch and transformers, which the project does not install. In a virtual
environment outside the repository:

    python3 -m venv /work/venv-hf && /work/venv-hf/bin/pip install torch transformers safetensors numpy
    ATTNKIT_HF_REFERENCE_DUMP=/tmp/hf-dump build/tests/test_model --gtest_filter='HfReferenceDump.*'
    /work/venv-hf/bin/python scripts/hf_check_reference.py /tmp/hf-dump

For every checkpoint folder the test wrote (config.json, safetensors, reference.json), it loads the
checkpoint with AutoModelForCausalLM in float64 with eager attention and compares:
  - the logits of one forward over each whole generated sequence (prompt and 16 greedy tokens) with
    the reference's dense forward, at every position;
  - transformers' own greedy generation (its KV cache, 16 new tokens) with the reference's tokens, and
    its per-step logits with the reference's.
transformers computes RoPE's cos/sin, the RMSNorm statistic and the softmax in float32 even in a
float64 model, so differences of ~1e-6 are expected; anything near a greedy margin is not.
Prints one line per checkpoint and exits non-zero when a token differs or a logit is off by more
than --tolerance.
"""

import argparse
import copy
import json
import pathlib
import sys


def load_model(folder):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float64, attn_implementation="eager")
    model.eval()
    return model


def max_abs_diff(reference_rows, tensor):
    import torch

    expected = torch.tensor(reference_rows, dtype=torch.float64)
    return (tensor.to(torch.float64) - expected).abs().max().item()


def check_run(model, run):
    import torch

    prompt, tokens = run["prompt"], run["tokens"]
    sequence = torch.tensor([prompt + tokens], dtype=torch.long)
    with torch.no_grad():
        logits = model(input_ids=sequence).logits[0]
        forward_diff = max_abs_diff(run["sequence_logits"], logits)
        # No end-of-sequence token: the reference generates its steps whatever it picks.
        # transformers 5 refills an eos_token_id of None from the model's own config: clear it at the
        # source too, or a greedy end-of-sequence token ends the run early.
        model.generation_config.eos_token_id = None
        config = copy.deepcopy(model.generation_config)
        config.update(eos_token_id=None, pad_token_id=0, max_new_tokens=len(tokens), do_sample=False, num_beams=1,
                      output_logits=True, return_dict_in_generate=True)
        generated = model.generate(
            input_ids=torch.tensor([prompt], dtype=torch.long),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            generation_config=config,
        )
    hf_tokens = generated.sequences[0, len(prompt):].tolist()
    step_logits = torch.stack([step[0] for step in generated.logits])
    step_diff = max_abs_diff(run["step_logits"], step_logits)
    return forward_diff, step_diff, hf_tokens == tokens, hf_tokens, min(run["margins"])


def describe_config(model):
    config = model.config
    parts = [config.model_type]
    layer_types = getattr(config, "layer_types", None)
    if layer_types:
        parts.append("layers=" + "".join("S" if t == "sliding_attention" else "F" for t in layer_types))
    window = getattr(config, "sliding_window", None)
    parts.append(f"window={window}")
    return " ".join(parts)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dump", type=pathlib.Path, help="the folder ATTNKIT_HF_REFERENCE_DUMP named")
    parser.add_argument("--tolerance", type=float, default=1e-4, help="largest allowed |logit difference|")
    args = parser.parse_args()

    import torch
    import transformers

    torch.set_grad_enabled(False)
    transformers.utils.logging.disable_progress_bar()
    print(f"torch {torch.__version__}, transformers {transformers.__version__}")
    folders = sorted(p.parent for p in args.dump.glob("*/reference.json"))
    if not folders:
        print(f"no */reference.json under {args.dump}", file=sys.stderr)
        return 2
    failures = 0
    worst_by_family = {}
    for folder in folders:
        reference = json.loads((folder / "reference.json").read_text())
        model = load_model(folder)
        worst_forward = worst_step = 0.0
        all_tokens_equal = True
        smallest_margin = float("inf")
        for run in reference["runs"]:
            forward_diff, step_diff, tokens_equal, hf_tokens, margin = check_run(model, run)
            worst_forward = max(worst_forward, forward_diff)
            worst_step = max(worst_step, step_diff)
            smallest_margin = min(smallest_margin, margin)
            if not tokens_equal:
                all_tokens_equal = False
                print(f"  {folder.name}: tokens differ: reference {run['tokens']} transformers {hf_tokens}")
        ok = all_tokens_equal and worst_forward <= args.tolerance and worst_step <= args.tolerance
        failures += 0 if ok else 1
        family = reference["preset"]
        worst_by_family[family] = max(worst_by_family.get(family, 0.0), worst_forward, worst_step)
        print(
            f"{'ok  ' if ok else 'FAIL'} {folder.name:28s} [{describe_config(model)}] "
            f"forward max|diff| {worst_forward:.3e}, generate step logits max|diff| {worst_step:.3e}, "
            f"tokens {'equal' if all_tokens_equal else 'DIFFER'}, smallest greedy margin {smallest_margin:.3f}"
        )
    print("max |logit diff| per preset: " + ", ".join(f"{k} {v:.3e}" for k, v in sorted(worst_by_family.items())))
    print(f"{len(folders) - failures} passed, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
