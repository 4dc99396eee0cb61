"""MATLAB ``.mat`` files of published datasets (Flowers-102's labels and splits, ImageNet's devkit), read with
SciPy, which the suite extra installs (``pip install 'vitkit[suite]'``). Only numbers and strings are read:
a MATLAB file holds no code to run."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from ..errors import DatasetError
from ..paths import read_capped


def variable(source: Path | bytes, key: str, where: Path) -> np.ndarray:
    """The variable ``key`` of the MATLAB file ``source`` (a path, or its bytes read from ``where``)."""
    try:
        from scipy.io import loadmat  # optional: only these two datasets need it
        from scipy.io.matlab import MatReadError
    except ImportError:
        raise DatasetError(f"{where}: reading MATLAB files needs SciPy: pip install 'vitkit[suite]'") from None
    data = read_capped(source, f"the MATLAB file {where.name}") if isinstance(source, Path) else source
    try:
        values = loadmat(io.BytesIO(data), squeeze_me=True, variable_names=[key]).get(key)
    except (ValueError, TypeError, NotImplementedError, OSError, MatReadError) as error:
        raise DatasetError(f"{where}: not a readable MATLAB file ({error})") from None
    if values is None:
        raise DatasetError(f"{where}: has no variable {key!r}")
    return np.atleast_1d(np.asarray(values))


def integers(source: Path | bytes, key: str, where: Path) -> np.ndarray:
    """The integer vector ``key`` of a MATLAB file."""
    values = variable(source, key, where)
    if values.dtype.kind not in "iuf" or values.ndim != 1:
        raise DatasetError(f"{where}: {key!r} is not a vector of numbers")
    return values.astype(np.int64)


def records(source: Path | bytes, key: str, fields: tuple[str, ...], where: Path) -> list[dict[str, object]]:
    """The struct array ``key`` of a MATLAB file as dicts of ``fields``."""
    values = variable(source, key, where)
    names = values.dtype.names or ()
    missing = [name for name in fields if name not in names]
    if missing:
        raise DatasetError(f"{where}: {key!r} has no field(s) {missing}; expected {list(fields)}")
    return [{name: record[name] for name in fields} for record in values]
