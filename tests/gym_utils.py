"""NeMo Gym's environment for tests (`make nemo-gym` builds `.venv-nemo-gym`): whether it is there, and where."""

from __future__ import annotations

from pathlib import Path

import pytest

from server_utils import REPO

VENV = REPO / ".venv-nemo-gym"
needs_gym = pytest.mark.skipif(not (VENV / ".installed").exists(), reason="NeMo Gym's environment is not built: `make nemo-gym`")


def gym_site() -> Path:
    return next(VENV.glob("lib/python*/site-packages"))
