#!/usr/bin/env python3
"""The card's ceilings, measured now through PyTorch (GPU machine): the device-to-device copy rate
(bytes read plus written per second; a 2 GiB buffer, the median of 20 copies after 3 warm-ups), a
read-only stream rate (a sum over the same 2 GiB: bytes read per second; what a decode step, which
reads far more than it writes, can reach at best) and the bf16 matrix rate (8192 x 8192 x 8192 on
random data, the median of 20 after 3 warm-ups). Prints one line and writes JSON
(copy_bytes_per_s, read_bytes_per_s, bf16_flops_per_s, gpu, torch) to the given path.
"""

import json
import statistics
import sys


def median_ms(fn, repeats=20, warmups=3):
    import torch

    for _ in range(warmups):
        fn()
    times = []
    for _ in range(repeats):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times)


def main():
    import torch

    n = 1 << 30  # 2 GiB of bf16
    src = torch.empty(n, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    copy_ms = median_ms(lambda: dst.copy_(src))
    copy_rate = 2 * src.numel() * src.element_size() / (copy_ms / 1e3)
    out = torch.empty((), dtype=torch.float32, device="cuda")
    read_ms = median_ms(lambda: torch.sum(src, dtype=torch.float32, out=out))
    read_rate = src.numel() * src.element_size() / (read_ms / 1e3)
    del src, dst
    m = 8192
    a = torch.randn(m, m, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(m, m, dtype=torch.bfloat16, device="cuda")
    mm_ms = median_ms(lambda: torch.matmul(a, b))
    flop_rate = 2 * m**3 / (mm_ms / 1e3)
    result = {"copy_bytes_per_s": copy_rate, "read_bytes_per_s": read_rate, "bf16_flops_per_s": flop_rate,
              "gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
    print(f"ceilings: copy {copy_rate / 1e12:.2f} TB/s (read+write), read-only stream {read_rate / 1e12:.2f} TB/s, "
          f"bf16 {flop_rate / 1e12:.0f} TFLOP/s on {result['gpu']}")
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
