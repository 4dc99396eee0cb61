import os
from pathlib import Path

import pytest
import torch

torch.set_num_threads(min(2, os.cpu_count() or 1))

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.fixture
def shared_data() -> Path:
    if not SHARED_DATA.exists():
        pytest.skip(f"real datasets not found at {SHARED_DATA}")
    return SHARED_DATA


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
