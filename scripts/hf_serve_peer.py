#!/usr/bin/env python3
"""The transformers peer of `attnkit serve-bench` (issue 34 §4), on the GPU machine.

Reads the requests of a serve-bench run (its serve_bench.json: each request's prompt and output
length) and runs the same lengths through transformers' `generate` on the same checkpoint: bf16,
SDPA attention, a static KV cache, greedy, every request exactly its output length (min and max new
tokens; no end-of-sequence stop). transformers has no scheduler, so requests go in fixed batches of
`--concurrency` in trace order, each batch left-padded to its longest prompt and run until its
longest output is done; a request's tokens past its own length are wasted work that a serving engine
would not do, and they are not counted. Token ids are seeded random ids of the same lengths: the
peer measures speed, not the same text (random weights make the text meaningless anyway).

Prints and writes (--out JSON) the useful output tokens per second, the wall time and the batch
count, with torch and transformers versions. Not part of CI (needs torch, transformers and a GPU).
"""

import argparse
import json
import pathlib
import time


def requests_of(run_json, index):
    data = json.loads(pathlib.Path(run_json).read_text())
    run = data["runs"][index]
    return [(r["prompt_len"], r["output_len"]) for r in run["requests"]]


def load(model_dir, static_cache):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16, attn_implementation="sdpa")
    model = model.to("cuda").eval()
    if static_cache:
        model.generation_config.cache_implementation = "static"
    return model


def run_batches(model, requests, concurrency, vocab, seed):
    import torch

    generator = torch.Generator().manual_seed(seed)
    useful = 0
    batches = 0
    torch.cuda.synchronize()
    start = time.perf_counter()
    for first in range(0, len(requests), concurrency):
        batch = requests[first:first + concurrency]
        longest_prompt = max(p for p, _ in batch)
        longest_output = max(o for _, o in batch)
        ids = torch.zeros(len(batch), longest_prompt, dtype=torch.long)
        mask = torch.zeros(len(batch), longest_prompt, dtype=torch.long)
        for row, (prompt_len, _) in enumerate(batch):
            ids[row, longest_prompt - prompt_len:] = torch.randint(3, vocab, (prompt_len,), generator=generator)
            mask[row, longest_prompt - prompt_len:] = 1
        with torch.no_grad():
            model.generate(input_ids=ids.cuda(), attention_mask=mask.cuda(), do_sample=False,
                           max_new_tokens=longest_output, min_new_tokens=longest_output, eos_token_id=None,
                           pad_token_id=0)
        useful += sum(o for _, o in batch)
        batches += 1
    torch.cuda.synchronize()
    return useful, batches, time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_dir")
    parser.add_argument("serve_bench_json", help="a serve-bench run whose request lengths to replay")
    parser.add_argument("--run", type=int, default=0, help="which run of the JSON (a sweep has several)")
    parser.add_argument("--concurrency", type=int, required=True, help="requests per generate() batch")
    parser.add_argument("--max-requests", type=int, default=0, help="only the first N requests (0: all)")
    parser.add_argument("--dynamic-cache", action="store_true", help="transformers' default cache instead of static")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", help="write the result as JSON here")
    args = parser.parse_args()

    import torch
    import transformers

    requests = requests_of(args.serve_bench_json, args.run)
    if args.max_requests:
        requests = requests[:args.max_requests]
    model = load(args.model_dir, not args.dynamic_cache)
    vocab = model.config.vocab_size
    run_batches(model, requests[:min(2, len(requests))], min(2, args.concurrency), vocab, args.seed)  # warm-up
    useful, batches, seconds = run_batches(model, requests, args.concurrency, vocab, args.seed)
    result = {
        "peer": "transformers generate",
        "cache": "dynamic" if args.dynamic_cache else "static",
        "attention": "sdpa",
        "concurrency": args.concurrency,
        "requests": len(requests),
        "batches": batches,
        "output_tokens": useful,
        "seconds": seconds,
        "output_tokens_per_s": useful / seconds if seconds > 0 else 0.0,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "gpu": torch.cuda.get_device_name(),
    }
    print(f"transformers peer: concurrency {args.concurrency}, {len(requests)} requests in {batches} batches, "
          f"{useful} output tokens in {seconds:.2f} s = {result['output_tokens_per_s']:.1f} tokens/s "
          f"({result['cache']} cache, sdpa, {result['gpu']})")
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
