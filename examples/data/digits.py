#!/usr/bin/env python3
"""digits.py OUTDIR - scikit-learn's bundled digits data set (1797 8x8
images of handwritten digits, 16 grey levels; no download) as the four .npy
files a Kiln training program reads from --data OUTDIR:

  train_x.npy  f32 [N, 64]  pixels scaled to [0, 1]
  train_y.npy  i64 [N]      labels 0..9
  test_x.npy, test_y.npy    the same, for the test accuracy

An 80/20 split, shuffled with a fixed seed, so every run writes the same
files.  Models that read images (examples/train_cnn.kl) reshape the 64
pixels to [1, 8, 8] themselves.  Needs scikit-learn (PyPI scikit-learn, or
Debian's python3-sklearn)."""
import os
import sys

import numpy as np


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: digits.py OUTDIR")
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        sys.exit("digits.py: scikit-learn is needed (pip install scikit-learn, or "
                 "apt-get install python3-sklearn)")
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(20261203).permutation(len(y))
    n_train = int(round(0.8 * len(y)))
    parts = {"train": order[:n_train], "test": order[n_train:]}
    for name, idx in parts.items():
        np.save(os.path.join(out, name + "_x.npy"), x[idx])
        np.save(os.path.join(out, name + "_y.npy"), y[idx])
    print("digits: %d train, %d test samples of 64 pixels, 10 classes -> %s"
          % (n_train, len(y) - n_train, out))


if __name__ == "__main__":
    main()
