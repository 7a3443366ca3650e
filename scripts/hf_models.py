#!/usr/bin/env python3
"""Random-weight Hugging Face checkpoints in published shapes, transformers' own greedy reference for
them, and the comparison of `attnkit generate` with that reference (issue 34, section 1).

    hf_models.py make DIR --family llama|llama8b|qwen3|gemma2|gemma3 [--tiny] [--plain] [--seed N] [--device D]
    hf_models.py reference DIR [--steps 64] [--device cuda|cpu] [--bf16-run PREFIX]
    hf_models.py compare DIR RUN.json RUN.npy [RUN.json RUN.npy ...] [--label FAMILY] [--results FILE]
    hf_models.py note --label FAMILY --run NAME --verdict refused|ERROR|skipped --notes TEXT --results FILE
    hf_models.py summary RESULTS OUTPUT.md [--conditions FILE]

scripts/device_models.sh runs them for every family and attention backend; they need torch,
transformers 5, safetensors and numpy (compare only numpy), which the project does not install.

make: the family's published shape (llama = Llama-3.2-1B, llama8b = Llama-3.1-8B, qwen3 = Qwen3-0.6B,
gemma2 = Gemma-2-2B, gemma3 = Gemma-3-1B text), or with --tiny the same features in a few layers of hidden 256 and a
vocabulary of 512 (the CPU dry-run), initialized by transformers from a seed and saved as bfloat16
safetensors, plus prompts.json: 4 prompts of seeded random token ids.

Why the weights are not left as transformers initializes them (--plain does leave them): with
normal(0, 0.02) weights the final hidden state points in no particular direction, so the logits over
the vocabulary are a Gaussian cloud, and the gap between the best and the second-best of 128k-262k
Gaussian samples is about std / sqrt(2 ln V), ~0.2 std, exponentially distributed. bfloat16
activations move a logit by ~1% of the logit scale, so some of 4 x 64 greedy steps would be a coin
toss and the first flip changes every later token: "token-exact" would measure luck. Scaling the
embedding or the LM head, or raising initializer_range, does not help: the gap and the error scale
together (a uniform scale of the head scales both; layers see RMS-normalized inputs). What makes a
greedy choice decisive is a final hidden state that points at one row of the head. So:
  - the embedding is redrawn at a scale where the current token's embedding dominates the residual
    stream: its norm is K = 12 times the per-element RMS of what the layers add, measured on a
    calibration prompt at its worst position from the 7th on (attention over few tokens averages
    least, so adds most) and adjusted twice, since deeper layers see the embedding too;
  - the LM head is untied (tie_word_embeddings false; the published models tie it, and a tied head
    could only ever repeat the current token) and its row perm[t] is token t's embedding row, for
    a seeded random permutation perm that is one cycle through the vocabulary: after token t the
    model says perm[t], never a short loop, with a margin over the runner-up of about
    K - sqrt(2 ln V) ~ 7 standard deviations of the other logits;
  - the head is scaled so that the chosen token's logit is about 24 before Gemma-2's final soft-cap
    of 30 (tanh still far from flat there), the other logits then having a standard deviation of ~2.
Every other weight is transformers' initialization; bf16 values stay far from overflow (|x| < ~100).
The tokens then follow the permutation whatever the attention does, so they are only half the test:
the other ~V-1 logits of every step are a random function of the whole context through every layer's
attention (RMS ~ 1/K of the chosen one), and compare checks all of them against the float32
reference.

reference: loads DIR with AutoModelForCausalLM in float32 with eager attention (TF32 off), generates
--steps greedy tokens for each prompt alone (its own KV cache, no end-of-sequence stop) and writes
DIR/reference.npz: tokens [prompts, steps] int32 and logits [prompts, steps, vocab] float32.
--bf16-run PREFIX then converts the same model to bfloat16 and writes PREFIX.json and PREFIX.npy in
the format of `attnkit generate --output-json/--output-logits`: transformers' own bf16 error, the
yardstick for attnkit's.

compare: per prompt, the steps whose tokens equal the reference's, the max |logit difference| over
every step up to and including the first divergence (those steps saw the same context), the
reference's top-2 margin there; one line per run, PASS or FAIL (see TOLERANCE below), appended as
a JSON line to --results; note records a run with nothing to compare; summary turns the results into
a markdown table.
"""

import argparse
import json
import math
import pathlib
import sys

PROMPT_LENGTHS = (7, 33, 130, 517)
DECISIVE_K = 12.0  # the current token's embedding norm over the per-element RMS the layers add
CHOSEN_LOGIT = 24.0  # the median logit of the chosen token, before any final soft-cap
FIRST_GENERATED = min(PROMPT_LENGTHS) - 1  # the position whose logits choose the first generated token

# TOLERANCE. attnkit runs bfloat16 weights and activations (float32 accumulation); the reference is
# float32 with the same (bf16-rounded) weights. A bf16 activation carries a relative rounding error
# of 2^-9; through ~30-50 rounded tensors per layer and tens of layers the final hidden state ends
# ~1% off, and each logit moves by about that fraction of the logit scale (the chosen token's logit,
# max|logit|). So the bound is relative to the scale of the step: max|diff| <= REL_TOL * max|ref
# logit| + ABS_TOL, REL_TOL = 0.05 (5%: a few times the expected error, well below what a wrong
# mask, window, soft-cap or KV position does: those move the other logits by their whole spread,
# ~1/K = 8% of the scale, and the chosen one by as much) and ABS_TOL = 0.05 (the bf16 rounding of a
# logit near 16-32 is 0.06-0.125 alone). transformers' own bf16 run (reference --bf16-run) is
# compared by the same rule and printed beside attnkit's, so the lead sees the measured error of
# a bf16 implementation of the same model.
REL_TOL = 0.05
ABS_TOL = 0.05
# A token divergence is a FAIL whatever the margin: with the decisive weights above the reference's
# top-2 margin is ~7 standard deviations of the other logits, so a divergence means the logits moved
# by far more than bf16 moves them. Where the reference margin at the divergence is within the
# logit tolerance the line says "near tie" (possible only with --plain weights), for the reader.


# --- make --------------------------------------------------------------------------------------------


def llama_config(tiny):
    if tiny:
        shape = dict(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=2048)
        # A short original context puts Llama 3's three frequency bands inside head_dim 64.
        rope = dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                    original_max_position_embeddings=64)
    else:  # Llama-3.2-1B
        shape = dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                     num_attention_heads=32, num_key_value_heads=8, head_dim=64, max_position_embeddings=131072)
        rope = dict(rope_type="llama3", rope_theta=500000.0, factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
                    original_max_position_embeddings=8192)
    return "LlamaConfig", dict(shape, rms_norm_eps=1e-5, rope_parameters=rope, tie_word_embeddings=True,
                               bos_token_id=128000 if not tiny else 1, eos_token_id=128001 if not tiny else 2,
                               hidden_act="silu", attention_bias=False, mlp_bias=False)


def qwen3_config(tiny):
    if tiny:
        shape = dict(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=2048)
    else:  # Qwen3-0.6B
        shape = dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                     num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960)
    layers = shape["num_hidden_layers"]
    return "Qwen3Config", dict(shape, rms_norm_eps=1e-6, rope_parameters=dict(rope_type="default", rope_theta=1e6),
                               tie_word_embeddings=True, use_sliding_window=False, max_window_layers=layers,
                               layer_types=["full_attention"] * layers, bos_token_id=151643 if not tiny else 1,
                               eos_token_id=151645 if not tiny else 2, hidden_act="silu", attention_bias=False)


def gemma2_config(tiny):
    if tiny:
        shape = dict(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=2048,
                     sliding_window=16, query_pre_attn_scalar=48)
    else:  # Gemma-2-2B
        shape = dict(vocab_size=256000, hidden_size=2304, intermediate_size=9216, num_hidden_layers=26,
                     num_attention_heads=8, num_key_value_heads=4, head_dim=256, max_position_embeddings=8192,
                     sliding_window=4096, query_pre_attn_scalar=256)
    # Layer i slides when i is even (Gemma2Config's own rule, written out).
    types = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(shape["num_hidden_layers"])]
    return "Gemma2Config", dict(shape, rms_norm_eps=1e-6, rope_parameters=dict(rope_type="default", rope_theta=10000.0),
                                attn_logit_softcapping=50.0, final_logit_softcapping=30.0, layer_types=types,
                                hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True, bos_token_id=2,
                                eos_token_id=1, pad_token_id=0, attention_bias=False)


def gemma3_config(tiny):
    if tiny:
        shape = dict(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=6,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=2048,
                     sliding_window=16, query_pre_attn_scalar=48)
    else:  # Gemma-3-1B (text)
        shape = dict(vocab_size=262144, hidden_size=1152, intermediate_size=6912, num_hidden_layers=26,
                     num_attention_heads=4, num_key_value_heads=1, head_dim=256, max_position_embeddings=32768,
                     sliding_window=512, query_pre_attn_scalar=256)
    # Five sliding layers, then a global one (sliding_window_pattern 6), written out as layer_types.
    types = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(shape["num_hidden_layers"])]
    rope = {"full_attention": dict(rope_type="default", rope_theta=1e6),
            "sliding_attention": dict(rope_type="default", rope_theta=10000.0)}
    return "Gemma3TextConfig", dict(shape, rms_norm_eps=1e-6, rope_parameters=rope, layer_types=types,
                                    attn_logit_softcapping=None, final_logit_softcapping=None,
                                    hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True,
                                    bos_token_id=2, eos_token_id=1, pad_token_id=0, attention_bias=False)


def llama8b_config(tiny):
    """Llama-3.1-8B's shape (its published config.json): the shape the engine's benchmarks run, and
    the only one here FlashInfer's XQA decode kernel is instantiated for (4 query heads per KV head,
    head 128). `tiny` gives the tiny llama (the dry run has no 8B)."""
    if tiny:
        return llama_config(tiny)
    shape = dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                 num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=131072)
    rope = dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                original_max_position_embeddings=8192)
    return "LlamaConfig", dict(shape, rms_norm_eps=1e-5, rope_parameters=rope, tie_word_embeddings=False,
                               bos_token_id=128000, eos_token_id=128001, hidden_act="silu", attention_bias=False,
                               mlp_bias=False)


FAMILIES = {"llama": llama_config, "llama8b": llama8b_config, "qwen3": qwen3_config, "gemma2": gemma2_config,
            "gemma3": gemma3_config}


def build_config(family, tiny, plain):
    import transformers

    class_name, fields = FAMILIES[family](tiny)
    if not plain:
        fields["tie_word_embeddings"] = False  # the permuted head (see the module's docstring)
    config = getattr(transformers, class_name)(**fields)
    check_config(config, fields)
    return config


def check_config(config, fields):
    """transformers keeps what it was given: a renamed or dropped field in this version shows here."""
    for key, value in fields.items():
        got = getattr(config, key, None)
        if key == "rope_parameters":
            for name, expected in flatten(value):
                actual = lookup(got, name)
                if actual != expected:
                    raise SystemExit(f"config rope_parameters{name}: transformers has {actual!r}, expected {expected!r}")
        elif got != value:
            raise SystemExit(f"config {key}: transformers has {got!r}, expected {value!r}")


def flatten(value, prefix=""):
    if isinstance(value, dict):
        for k, v in value.items():
            yield from flatten(v, f"{prefix}.{k}")
    else:
        yield prefix, value


def lookup(value, dotted):
    for part in dotted.strip(".").split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def calibration_stats(model, ids):
    """The residual stream entering layer 0 (x0) and entering the final norm (x_final), and the LM
    head's output (before any final soft-cap), for one forward over `ids`."""
    import torch

    seen = {}
    inner = model.model
    hooks = [
        inner.layers[0].register_forward_pre_hook(
            lambda m, args, kwargs: seen.__setitem__("x0", (args[0] if args else kwargs["hidden_states"]).float()),
            with_kwargs=True),
        inner.norm.register_forward_pre_hook(lambda m, args: seen.__setitem__("x_final", args[0].float())),
        model.lm_head.register_forward_hook(lambda m, args, out: seen.__setitem__("head", out.float())),
    ]
    try:
        with torch.no_grad():
            model(input_ids=ids, use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    return seen


def make_decisive(model, seed, device):
    """Redraws the embedding and builds the permuted head (module docstring)."""
    import torch

    embed = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    vocab, hidden = embed.shape
    gen = torch.Generator(device=device).manual_seed(seed + 1)
    rows = torch.randn(vocab, hidden, generator=gen, device=device)  # unit per-element variance
    # One cycle through the whole vocabulary (a random permutation of 512 ids often has a short one).
    order = torch.randperm(vocab, generator=gen, device=device)
    perm = torch.empty_like(order)
    perm[order] = order.roll(-1)
    ids = torch.randint(3, vocab, (1, 96), generator=gen, device=device)
    scale = 1.0
    with torch.no_grad():
        for _ in range(3):
            embed.copy_(rows * scale)
            head.copy_(rows[torch.argsort(perm)])  # head[perm[t]] = rows[t]
            seen = calibration_stats(model, ids)
            # The layers add most where attention averages few tokens: the worst position from the
            # shortest prompt's first generated one on sets the scale.
            per_position = (seen["x_final"] - seen["x0"])[0, FIRST_GENERATED:].pow(2).mean(-1).sqrt()
            layers_rms = per_position.max().item()
            x0_norm = seen["x0"].pow(2).sum(-1).sqrt().mean().item()
            scale *= DECISIVE_K * layers_rms / x0_norm
        embed.copy_(rows * scale)
        seen = calibration_stats(model, ids)
        chosen = seen["head"][0].gather(-1, perm[ids[0]].unsqueeze(-1)).median().item()
        head.mul_(CHOSEN_LOGIT / chosen)
        seen = calibration_stats(model, ids)
    logits = seen["head"][0]
    chosen = logits.gather(-1, perm[ids[0]].unsqueeze(-1)).squeeze(-1)[FIRST_GENERATED:]
    others = logits.scatter(-1, perm[ids[0]].unsqueeze(-1), float("-inf"))[FIRST_GENERATED:]
    margin = (chosen - others.max(-1).values).min().item()
    return dict(embedding_scale=scale, chosen_logit_median=chosen.median().item(),
                other_logit_std=others[others.isfinite()].std().item(), smallest_margin=margin)


def make_prompts(vocab, seed, lengths):
    import torch

    gen = torch.Generator().manual_seed(seed + 2)
    # Ids from 3 on: no bos/eos/pad, which some tokenizers treat specially (here only habit).
    return [torch.randint(3, vocab, (n,), generator=gen).tolist() for n in lengths]


def cmd_make(args):
    import torch
    import transformers

    out = pathlib.Path(args.dir)
    if out.exists() and any(out.iterdir()):
        raise SystemExit(f"{out}: not an empty directory")
    config = build_config(args.family, args.tiny, args.plain)
    torch.manual_seed(args.seed)
    with torch.device(args.device):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    stats = {} if args.plain else make_decisive(model, args.seed, args.device)
    model = model.to(torch.bfloat16)
    model.save_pretrained(out)
    lengths = [int(n) for n in args.prompt_lengths.split(",")]
    prompts = make_prompts(config.vocab_size, args.seed, lengths)
    (out / "prompts.json").write_text(json.dumps({"family": args.family, "seed": args.seed, "tiny": args.tiny,
                                                  "plain": args.plain, "decisive": stats, "prompts": prompts}))
    described = ", ".join(f"{k} {v:.4g}" for k, v in stats.items()) or "transformers' initialization (--plain)"
    print(f"made {out}: {args.family}{' tiny' if args.tiny else ''}, {config.num_hidden_layers} layers, hidden "
          f"{config.hidden_size}, vocab {config.vocab_size}, {model.num_parameters() / 1e9:.3f}B parameters; "
          f"{described}; prompts of {lengths} tokens")


# --- reference ---------------------------------------------------------------------------------------


def set_exact_float32():
    import torch

    # The reference is IEEE float32: no TF32 in matrix products or convolutions.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")


def greedy(model, prompt, steps, device):
    """Greedy tokens and the logits each was chosen from, for one prompt alone (its own cache)."""
    import copy

    import torch

    # No end-of-sequence stop, nothing that changes a greedy choice. transformers 5 fills a field
    # left None from the model's own generation_config, so its eos goes there too.
    model.generation_config.eos_token_id = None
    config = copy.deepcopy(model.generation_config)
    config.update(eos_token_id=None, pad_token_id=0, max_new_tokens=steps, do_sample=False,
                  num_beams=1, output_logits=True, return_dict_in_generate=True, temperature=None, top_p=None,
                  top_k=None, repetition_penalty=None)
    ids = torch.tensor([prompt], dtype=torch.long, device=device)
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=config)
    tokens = out.sequences[0, len(prompt):].tolist()
    if len(tokens) != steps or len(out.logits) != steps:
        raise SystemExit(f"transformers generated {len(tokens)} tokens ({len(out.logits)} logit rows), not {steps}")
    logits = torch.stack([step[0] for step in out.logits]).float().cpu().numpy()
    return tokens, logits


def run_all(model, prompts, steps, device):
    import numpy as np

    tokens = np.zeros((len(prompts), steps), dtype=np.int32)
    logits = None
    for i, prompt in enumerate(prompts):
        t, lg = greedy(model, prompt, steps, device)
        if logits is None:
            logits = np.empty((len(prompts), steps, lg.shape[-1]), dtype=np.float32)
        tokens[i], logits[i] = t, lg
    return tokens, logits


def cmd_reference(args):
    import time

    import numpy as np
    import torch
    import transformers

    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    set_exact_float32()
    folder = pathlib.Path(args.dir)
    prompts = json.loads((folder / "prompts.json").read_text())["prompts"]
    start = time.time()
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                                              attn_implementation="eager").to(args.device).eval()
    tokens, logits = run_all(model, prompts, args.steps, args.device)
    np.savez(folder / "reference.npz", tokens=tokens, logits=logits)
    print(f"reference {folder}: float32 eager on {args.device}, {len(prompts)} prompts x {args.steps} steps, "
          f"{time.time() - start:.1f} s; smallest top-2 margin {top2_margins(logits).min():.3f}, "
          f"max|logit| {np.abs(logits).max():.2f}")
    if args.bf16_run:
        start = time.time()
        model = model.to(torch.bfloat16)
        run_tokens, run_logits = run_all(model, prompts, args.steps, args.device)
        write_run(args.bf16_run, prompts, run_tokens, run_logits)
        print(f"transformers bfloat16 run: {args.bf16_run}.json/.npy, {time.time() - start:.1f} s")


def write_run(prefix, prompts, tokens, logits):
    """The format of attnkit generate --output-json / --output-logits."""
    import numpy as np

    outputs = [{"prompt_ids": p, "token_ids": t.tolist()} for p, t in zip(prompts, tokens)]
    pathlib.Path(prefix + ".json").write_text(json.dumps({"backend": "transformers-bf16", "outputs": outputs}))
    np.save(prefix + ".npy", logits.astype(np.float32))


# --- compare -----------------------------------------------------------------------------------------


def top2_margins(logits):
    """Best minus second-best logit of each row (last axis)."""
    import numpy as np

    top2 = np.partition(logits, -2, axis=-1)[..., -2:]
    return top2[..., 1] - top2[..., 0]


def compare_prompt(ref_tokens, ref_logits, run_tokens, run_logits):
    """One prompt: steps matched, and the logits of every step that saw the reference's context."""
    import numpy as np

    steps = len(ref_tokens)
    n = min(steps, len(run_tokens))
    differing = [i for i in range(n) if ref_tokens[i] != run_tokens[i]]
    matched = differing[0] if differing else n
    compared = min(matched + 1, n)  # the divergent step itself saw the same context
    diff = np.abs(run_logits[:compared].astype(np.float64) - ref_logits[:compared])
    max_diff = float(np.nan_to_num(diff, nan=np.inf).max()) if compared else 0.0
    scale = float(np.abs(ref_logits[:compared]).max()) if compared else 0.0
    result = dict(matched=matched, steps=steps, max_diff=max_diff, scale=scale,
                  min_margin=float(top2_margins(ref_logits[:compared]).min()) if compared else math.nan)
    if matched < n:
        row = run_logits[matched]
        result.update(diverged=matched, ref_token=int(ref_tokens[matched]), run_token=int(run_tokens[matched]),
                      ref_margin=float(top2_margins(ref_logits[matched])),
                      run_gap=float(row[run_tokens[matched]] - row[ref_tokens[matched]]))
    return result


def read_run(json_path, npy_path, prompts, vocab):
    import numpy as np

    run = json.loads(pathlib.Path(json_path).read_text())
    outputs = run["outputs"]
    if [o["prompt_ids"] for o in outputs] != prompts:
        raise ValueError(f"{json_path}: its prompts are not the {len(prompts)} prompts of prompts.json")
    logits = np.load(npy_path, mmap_mode="r")
    if logits.ndim != 3 or logits.shape[0] != len(prompts) or logits.shape[2] != vocab:
        raise ValueError(f"{npy_path}: shape {logits.shape}, expected ({len(prompts)}, steps, {vocab})")
    return run, [o["token_ids"] for o in outputs], logits


def graph_replays(run):
    steps = run.get("steps") or []
    return sum(1 for s in steps if s.get("graph_replayed")), len(steps)


def summarize(results):
    """The verdict of one run and its numbers (TOLERANCE above)."""
    matched = sum(r["matched"] for r in results)
    total = sum(r["steps"] for r in results)
    max_diff = max(r["max_diff"] for r in results)
    scale = max(r["scale"] for r in results)
    tolerance = REL_TOL * scale + ABS_TOL
    margin = min(r["min_margin"] for r in results)
    notes = []
    for i, r in enumerate(results):
        if "diverged" in r:
            tie = " (near tie)" if r["ref_margin"] <= tolerance else ""
            notes.append(f"prompt {i} diverges at step {r['diverged']}: reference {r['ref_token']} by margin "
                         f"{r['ref_margin']:.3g}{tie}, run {r['run_token']} by {r['run_gap']:.3g}")
    passed = matched == total and max_diff <= tolerance
    return dict(verdict="PASS" if passed else "FAIL", tokens=f"{matched}/{total}", max_diff=max_diff,
                tolerance=tolerance, scale=scale, min_margin=margin, notes="; ".join(notes))


def describe(row):
    """One line of a result."""
    if "max_diff" not in row:  # refused, an error, unreadable output
        return f"{row['verdict']} {row['label']}: {row.get('notes', '')}"
    line = (f"{row['verdict']} {row['label']}: tokens {row['tokens']}, max|dlogit| {row['max_diff']:.4g} "
            f"(tol {row['tolerance']:.3g} = {REL_TOL}*max|logit| {row['scale']:.3g} + {ABS_TOL}), "
            f"min ref margin {row['min_margin']:.3g}")
    if row.get("graph_replays") or row["label"].endswith("-graph"):
        line += f", graph replays {row['graph_replays']}/{row['graph_steps']} steps"
    return line + (f"; {row['notes']}" if row.get("notes") else "")


def compare_run(folder, prompts, ref_tokens, ref_logits, json_path, npy_path):
    run, run_tokens, run_logits = read_run(json_path, npy_path, prompts, ref_logits.shape[2])
    results = [compare_prompt(ref_tokens[i], ref_logits[i], run_tokens[i], run_logits[i]) for i in range(len(prompts))]
    row = summarize(results)
    row["graph_replays"], row["graph_steps"] = graph_replays(run)
    return row


def append_row(path, row):
    if path:
        with open(path, "a") as out:
            out.write(json.dumps(row) + "\n")


def cmd_compare(args):
    """Every RUN.json RUN.npy pair against the reference, which is read once."""
    import numpy as np

    folder = pathlib.Path(args.dir)
    if len(args.runs) % 2:
        raise SystemExit("compare takes RUN.json RUN.npy pairs")
    prompts = json.loads((folder / "prompts.json").read_text())["prompts"]
    ref = np.load(folder / "reference.npz")
    ref_tokens, ref_logits = ref["tokens"], ref["logits"]
    failed = 0
    for json_path, npy_path in zip(args.runs[::2], args.runs[1::2]):
        label = pathlib.Path(json_path).stem
        meta = dict(label=f"{args.label} {label}".strip(), family=args.label, run=label)
        try:
            row = dict(meta, **compare_run(folder, prompts, ref_tokens, ref_logits, json_path, npy_path))
            if label.endswith("-graph") and not row["graph_replays"]:  # the mode was not exercised
                row["notes"] = "; ".join(filter(None, [row["notes"], "no step ran as a CUDA graph"]))
        except (OSError, ValueError, KeyError) as e:  # a run whose files are missing or malformed
            row = dict(meta, verdict="FAIL", notes=f"unreadable output: {e}")
        failed += row["verdict"] != "PASS"
        print(describe(row), flush=True)
        append_row(args.results, row)
    return 1 if failed else 0


def cmd_note(args):
    """A run without outputs to compare: a refusal or an error, as one result."""
    row = dict(label=f"{args.label} {args.run}", family=args.label, run=args.run, verdict=args.verdict,
               notes=args.notes)
    print(describe(row), flush=True)
    append_row(args.results, row)


def cmd_summary(args):
    """summary.md: the conditions, then one table row per result, with each attnkit run's logit
    error next to transformers' own bfloat16 error on the same family."""
    rows = [json.loads(line) for line in pathlib.Path(args.results).read_text().splitlines() if line.strip()]
    families = list(dict.fromkeys(r["family"] for r in rows))
    rows.sort(key=lambda r: (families.index(r["family"]), r["run"] != "transformers-bf16", r["run"]))
    yardstick = {r["family"]: r["max_diff"] for r in rows if r["run"] == "transformers-bf16" and "max_diff" in r}
    out = ["# attnkit generate vs transformers (float32 eager reference)", ""]
    if args.conditions:
        out += ["```", pathlib.Path(args.conditions).read_text().rstrip(), "```", ""]
    out += [f"Tolerance: max|dlogit| <= {REL_TOL} * max|reference logit| + {ABS_TOL} over the steps that saw the "
            "reference's context, and every token equal (scripts/hf_models.py says why).", "",
            "| family | run | verdict | tokens | max abs dlogit | tol | x transformers-bf16 | min ref margin | graph | notes |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "max_diff" in r:
            base = yardstick.get(r["family"])
            ratio = f"{r['max_diff'] / base:.2f}" if base else ""
            graph = f"{r['graph_replays']}/{r['graph_steps']}" if r.get("graph_replays") or r["run"].endswith("-graph") else ""
            cells = [r["tokens"], f"{r['max_diff']:.4g}", f"{r['tolerance']:.3g}", ratio, f"{r['min_margin']:.3g}", graph]
        else:
            cells = [""] * 6
        notes = r.get("notes", "").replace("|", "/").replace("\n", " ")
        out.append("| " + " | ".join([r["family"], r["run"], r["verdict"]] + cells + [notes]) + " |")
    counts = {}
    for r in rows:
        counts[r["verdict"]] = counts.get(r["verdict"], 0) + 1
    out += ["", "Totals: " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))]
    pathlib.Path(args.output).write_text("\n".join(out) + "\n")
    print(out[-1])
    return 0


# --- command line ------------------------------------------------------------------------------------


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    make = sub.add_parser("make", help="write a random-weight checkpoint and prompts.json")
    make.add_argument("dir")
    make.add_argument("--family", required=True, choices=sorted(FAMILIES))
    make.add_argument("--tiny", action="store_true", help="a few layers of hidden 256, vocabulary 512")
    make.add_argument("--plain", action="store_true", help="transformers' initialization, tied head (near ties)")
    make.add_argument("--seed", type=int, default=34)
    make.add_argument("--device", default="cpu", help="where to initialize (cuda is faster for full shapes)")
    make.add_argument("--prompt-lengths", default=",".join(map(str, PROMPT_LENGTHS)))
    make.set_defaults(func=cmd_make)
    ref = sub.add_parser("reference", help="transformers' float32 greedy tokens and logits")
    ref.add_argument("dir")
    ref.add_argument("--steps", type=int, default=64)
    ref.add_argument("--device", default="cuda")
    ref.add_argument("--bf16-run", metavar="PREFIX", help="also transformers in bfloat16, as attnkit's output files")
    ref.set_defaults(func=cmd_reference)
    cmp = sub.add_parser("compare", help="attnkit generate's outputs against the reference")
    cmp.add_argument("dir")
    cmp.add_argument("runs", nargs="+", metavar="RUN.json RUN.npy", help="pairs; a run is named by its file's stem")
    cmp.add_argument("--label", default="", help="what each line names first (the family)")
    cmp.add_argument("--results", help="append each result as a JSON line to this file")
    cmp.set_defaults(func=cmd_compare)
    note = sub.add_parser("note", help="record a run that has nothing to compare (refused, error)")
    note.add_argument("--label", required=True)
    note.add_argument("--run", required=True)
    note.add_argument("--verdict", required=True)
    note.add_argument("--notes", default="")
    note.add_argument("--results")
    note.set_defaults(func=cmd_note)
    summ = sub.add_parser("summary", help="write summary.md from the results file")
    summ.add_argument("results")
    summ.add_argument("output")
    summ.add_argument("--conditions", help="a text file printed first")
    summ.set_defaults(func=cmd_summary)
    args = parser.parse_args()
    return args.func(args) or 0


if __name__ == "__main__":
    sys.exit(main())
