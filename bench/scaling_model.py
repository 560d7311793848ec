#!/usr/bin/env python3
"""scaling_model.py - expected data-parallel scaling efficiency from a ring
all-reduce model (docs/SCALING.md).

    python3 bench/scaling_model.py GRAD_BYTES COMPUTE_MS [BACKWARD_FRACTION]

For each cluster below, the time of one all-reduce of GRAD_BYTES over N
ranks with a ring (what NCCL uses for large buffers) is

    t = 2 (N - 1) / N * GRAD_BYTES / B  +  2 (N - 1) * alpha

B the bus bandwidth (nccl-tests' busbw: the rate each rank's slowest link
moves data at in a ring) and alpha the latency of one hop.  Efficiency is
the step time on one GPU over the step time on N (the same per-rank
batch): without overlap COMPUTE / (COMPUTE + t); with the exchange started
bucket by bucket during the backward pass (Kiln's --data-parallel) only
the part of t longer than the backward pass after the first bucket is
ready (BACKWARD_FRACTION of the step, default 2/3: backward is about twice
the forward) is exposed, and at least the last bucket's exchange (25 MB,
the default --bucket-mb), which starts when the backward pass ends.
"""
import sys

# (name, ranks, bus bandwidth GB/s, hop latency us): the link rates are
# the hardware's; the published nccl-tests busbw they are checked against
# is in docs/SCALING.md
CLUSTERS = [
    ("8 GPUs, one node, NVLink 4 (H100/H200 SXM)", 8, 450.0, 5.0),
    ("4 nodes x 8 GPUs, 8 x 400 Gb/s InfiniBand NDR a node", 32, 400.0, 10.0),
]


def allreduce_ms(grad_bytes, ranks, busbw_gbs, alpha_us):
    return (2 * (ranks - 1) / ranks * grad_bytes / (busbw_gbs * 1e9) * 1e3
            + 2 * (ranks - 1) * alpha_us * 1e-3)


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    grad, compute = float(sys.argv[1]), float(sys.argv[2])
    frac = float(sys.argv[3]) if len(sys.argv) > 3 else 2 / 3
    print("gradients %.3g MB, compute %.3g ms a step (backward %.0f%% of it)" % (grad / 1e6, compute, 100 * frac))
    print("| cluster | all-reduce ms | efficiency, no overlap | efficiency, overlapped |")
    print("|---|---|---|---|")
    for name, n, bw, alpha in CLUSTERS:
        t = allreduce_ms(grad, n, bw, alpha)
        last = allreduce_ms(min(grad, 25 * 2 ** 20), n, bw, alpha)
        exposed = max(last, t - frac * compute)
        print("| %s | %.3f | %.1f%% | %.1f%% |" % (name, t, 100 * compute / (compute + t),
                                                  100 * compute / (compute + exposed)))


if __name__ == "__main__":
    main()
