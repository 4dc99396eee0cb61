"""Build ``src/vitkit/data/digits.npz`` from scikit-learn's copy of the UCI optical digits (8x8).

Run once (``python scripts/build_digits.py``); the result ships as package data so ``vitkit train``
needs neither scikit-learn nor a network. ``tests/test_data.py`` checks the file against
``sklearn.datasets.load_digits`` whenever scikit-learn is installed.
"""

from pathlib import Path

import numpy as np
from sklearn.datasets import load_digits

OUT = Path(__file__).resolve().parents[1] / "src" / "vitkit" / "data" / "digits.npz"


def main() -> None:
    digits = load_digits()
    images = digits.images.astype(np.uint8)  # (1797, 8, 8), grey levels 0..16
    assert np.array_equal(images, digits.images), "digits are integers 0..16"
    np.savez_compressed(OUT, images=images, labels=digits.target.astype(np.uint8))
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes, {len(images)} images)")


if __name__ == "__main__":
    main()
