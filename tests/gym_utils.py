"""NeMo Gym's environment for tests (`make nemo-gym` builds `.venv-nemo-gym`): where it is, and who is still running."""

from __future__ import annotations

from pathlib import Path

import pytest

from server_utils import REPO

VENV = REPO / ".venv-nemo-gym"
needs_gym = pytest.mark.skipif(not (VENV / ".installed").exists(), reason="NeMo Gym's environment is not built: `make nemo-gym`")


def gym_site() -> Path:
    return next(VENV.glob("lib/python*/site-packages"))


def session_members(session: int) -> list[int]:
    """The live processes whose session id is `session` (Ray's workers leave ng_run's process group, not its session)."""
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == session and fields[0] != "Z":
                members.append(int(entry.name))
    return members
