#!/usr/bin/env python3
"""The engine's decode steps against the card's floor (issue 34 §2).

Inputs: serve-bench JSON files of closed-loop runs where every request has the same prompt length
(the context) and starts together (`--lengths fixed --concurrency B --num-requests B`), so that once
the prompts are in, every step decodes exactly B requests; the model directory (config.json and
its safetensors, for the bytes a step reads); and the card's ceilings measured in the same session
(`--ceilings`: a JSON with copy_bytes_per_s, counting bytes read plus written, and bf16_flops_per_s).

A decode step of B requests at context L must at least read every weight once and every request's
K and V (L tokens x layers x 2 x kv_heads x head_dim x 2 bytes), and do 2 x parameters x B FLOPs
in the matrix products plus 4 x L x q_heads x head_dim x layers x B in attention. Its floor is
max(bytes / memory rate, FLOPs / matrix rate), where the memory rate is the copy's DRAM traffic
(bytes read plus written per second): a stream of reads alone moves no more bytes per second than
that, so it is the rate a step's reads can reach; where the ceilings also hold a read-only stream
rate (read_bytes_per_s: a reduction over a large buffer), the floor is given against it too. The
measured step is the median time of the run's decode steps (serve-bench's decode_step_ms: the steps
that decode every running request and prefill nothing, so no prefill chunk is counted as a
decode), host work included; runs from before that record fall back to the ITL p50 (marked).

Prints a Markdown table and writes it (--out) with the conditions.
"""

import argparse
import json
import pathlib


def model_bytes(model_dir):
    total = 0
    for f in pathlib.Path(model_dir).glob("*.safetensors"):
        with open(f, "rb") as handle:
            header_len = int.from_bytes(handle.read(8), "little")
            header = json.loads(handle.read(header_len))
        for name, entry in header.items():
            if name != "__metadata__":
                begin, end = entry["data_offsets"]
                total += end - begin
    return total


def shape(model_dir):
    config = json.loads((pathlib.Path(model_dir) / "config.json").read_text())
    config = config.get("text_config", config)
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    return {"layers": config["num_hidden_layers"], "q_heads": heads, "kv_heads": config["num_key_value_heads"],
            "head_dim": head_dim}


def floor_of(weights, s, batch, context, read_rate, flop_rate):
    kv_bytes = batch * context * s["layers"] * 2 * s["kv_heads"] * s["head_dim"] * 2
    parameters = weights / 2  # bf16
    flops = 2 * parameters * batch + 4 * context * s["q_heads"] * s["head_dim"] * s["layers"] * batch
    memory_s = (weights + kv_bytes) / read_rate
    compute_s = flops / flop_rate
    return max(memory_s, compute_s), ("memory" if memory_s >= compute_s else "compute"), weights + kv_bytes, flops


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_dir")
    parser.add_argument("runs", nargs="+", help="serve-bench JSON files")
    parser.add_argument("--ceilings", required=True)
    parser.add_argument("--out")
    args = parser.parse_args()
    ceilings = json.loads(pathlib.Path(args.ceilings).read_text())
    read_rate = ceilings["copy_bytes_per_s"]
    stream_rate = ceilings.get("read_bytes_per_s")
    flop_rate = ceilings["bf16_flops_per_s"]
    weights = model_bytes(args.model_dir)
    s = shape(args.model_dir)
    stream_note = f", read-only stream {stream_rate / 1e12:.2f} TB/s" if stream_rate else ""
    lines = [
        f"Ceilings measured in this session: copy {ceilings['copy_bytes_per_s'] / 1e12:.2f} TB/s (bytes read plus "
        f"written){stream_note}, bf16 {flop_rate / 1e12:.0f} TFLOP/s; weights {weights / 1e9:.2f} GB.",
        "",
        "| backend | batch | context | decode step p50 ms (steps) | floor ms | bound | ratio | ratio to stream floor "
        "| steps with graphs | target |",
        "|---|---:|---:|---:|---:|---|---:|---:|---:|---|",
    ]
    for path in args.runs:
        data = json.loads(pathlib.Path(path).read_text())
        backend = data["conditions"].get("backend", "?")
        for run in data["runs"]:
            trace = run["trace"]
            batch = trace.get("concurrency") or 0
            context = trace["input"].get("value") or trace["input"].get("max")
            if run.get("decode_steps"):
                measured_ms = run["decode_step_ms"]["p50"]
                measured = f"{measured_ms:.3f} ({run['decode_steps']})"
            else:
                measured_ms = run["itl_ms"]["p50"]
                measured = f"{measured_ms:.3f} (ITL p50: no step records)"
            floor_s, bound, _, _ = floor_of(weights, s, batch, context, read_rate, flop_rate)
            ratio = measured_ms / (floor_s * 1e3)
            stream_ratio = "-"
            if stream_rate:
                stream_floor_s, _, _, _ = floor_of(weights, s, batch, context, stream_rate, flop_rate)
                stream_ratio = f"{measured_ms / (stream_floor_s * 1e3):.2f}x"
            target = 1.10
            verdict = "met" if ratio <= target else f"not met (<= {target}x)"
            lines.append(f"| {backend} | {batch} | {context} | {measured} | {floor_s * 1e3:.3f} | {bound} | "
                         f"{ratio:.2f}x | {stream_ratio} | {run['graph_steps']}/{run['steps']} | {verdict} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        pathlib.Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
