"""The examples' data set, generated here so that nothing is downloaded: the ten digits drawn from a
5x7 pixel font, placed at a random position in a 12x12 image, with random stroke strength, randomly
dropped pixels and Gaussian noise. The same seed gives the same images on every rank."""

from __future__ import annotations

import numpy as np

FONT = {  # 5 columns x 7 rows per digit
    0: ["01110", "10001", "10011", "10101", "11001", "10001", "01110"],
    1: ["00100", "01100", "00100", "00100", "00100", "00100", "01110"],
    2: ["01110", "10001", "00001", "00010", "00100", "01000", "11111"],
    3: ["11111", "00010", "00100", "00010", "00001", "10001", "01110"],
    4: ["00010", "00110", "01010", "10010", "11111", "00010", "00010"],
    5: ["11111", "10000", "11110", "00001", "00001", "10001", "01110"],
    6: ["00110", "01000", "10000", "11110", "10001", "10001", "01110"],
    7: ["11111", "00001", "00010", "00100", "01000", "01000", "01000"],
    8: ["01110", "10001", "10001", "01110", "10001", "10001", "01110"],
    9: ["01110", "10001", "10001", "01111", "00001", "00010", "01100"],
}
SIDE = 12


def make_digits(count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``count`` noisy 12x12 digit images (float32, flattened) and their labels, the same on every rank."""
    rng = np.random.default_rng(seed)
    glyphs = np.array([[[c == "1" for c in row] for row in FONT[d]] for d in range(10)], dtype=np.float32)
    labels = rng.integers(0, 10, count)
    images = np.zeros((count, SIDE, SIDE), dtype=np.float32)
    rows = rng.integers(0, SIDE - 7 + 1, count)
    cols = rng.integers(0, SIDE - 5 + 1, count)
    strength = rng.uniform(0.7, 1.0, count).astype(np.float32)
    for i in range(count):
        images[i, rows[i]:rows[i] + 7, cols[i]:cols[i] + 5] = glyphs[labels[i]] * strength[i]
    images *= rng.random(images.shape) > 0.1  # drop pixels
    images += rng.normal(0.0, 0.2, images.shape).astype(np.float32)
    return images.reshape(count, -1), labels.astype(np.int64)
