"""The demo's data set: the UCI optical-recognition handwritten digits, shipped inside gcodec.

``data/digits.npz`` holds the 1,797 8x8 images (pixel counts 0..16, uint8) and their labels: the
copy of the UCI test set that scikit-learn bundles as ``sklearn.datasets.load_digits`` (the same
arrays, byte for byte: :data:`DIGITS_SHA256`). It is 45 kB, so gcodec ships it rather than depend on
scikit-learn and SciPy (~100 MB) for one table; nothing is downloaded at run time.

Source: E. Alpaydin, C. Kaynak, "Optical Recognition of Handwritten Digits", UCI Machine Learning
Repository, 1998 (https://doi.org/10.24432/C50P49), licensed CC BY 4.0.
"""

from __future__ import annotations

import hashlib
from importlib import resources

import numpy as np

#: sha256 of ``images.tobytes() + labels.tobytes()`` (uint8), as sklearn 1.9's ``load_digits`` gives them.
DIGITS_SHA256 = "87ff0c9e40dc7e2c0e34e7257799c2e3f3aec1a016363bb11cad869ec428a826"
#: Fraction of the 1,797 images held out for testing (360 images).
TEST_FRACTION = 0.2


def load_digits() -> tuple[np.ndarray, np.ndarray]:
    """(images (1797, 64) uint8 in 0..16, labels (1797,) uint8), checked against :data:`DIGITS_SHA256`."""
    with resources.files(__package__).joinpath("data/digits.npz").open("rb") as f, np.load(f) as z:
        images = np.ascontiguousarray(z["images"].reshape(-1, 64))
        labels = np.ascontiguousarray(z["labels"])
    digest = hashlib.sha256(images.tobytes() + labels.tobytes()).hexdigest()
    if digest != DIGITS_SHA256:
        raise RuntimeError(f"gcodec/demo/data/digits.npz is damaged (sha256 {digest})")
    return images, labels


def train_test_split(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x_train, y_train, x_test, y_test): features scaled to [0, 1] float32, labels int64.

    A fixed random permutation (``seed``) holds out :data:`TEST_FRACTION` of the images.
    """
    images, labels = load_digits()
    order = np.random.default_rng(seed).permutation(len(labels))
    n_test = round(TEST_FRACTION * len(labels))
    test, train = order[:n_test], order[n_test:]
    x = images.astype(np.float32) / np.float32(16.0)
    y = labels.astype(np.int64)
    return x[train], y[train], x[test], y[test]
