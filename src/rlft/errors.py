"""The errors rlft raises for mistakes a user can fix. The CLI prints them without a traceback."""

from __future__ import annotations


class RlftError(Exception):
    """Base class: a problem with a clear location and a fix, shown to the user as-is."""


class ConfigError(RlftError):
    """A config file, key or value is wrong. `problems` lists every (key path, message) found."""

    def __init__(self, message: str, problems: list[tuple[str, str]] | None = None):
        self.problems = problems or []
        super().__init__(message)


class DataError(RlftError):
    """A dataset cannot be loaded or a row is malformed; the message names dataset, row and field."""


class ModelError(RlftError):
    """A model, tokenizer, adapter or checkpoint cannot be loaded or built as configured."""


class CheckpointError(RlftError):
    """A checkpoint is missing, partial or corrupt."""


class NotImplementedYet(RlftError):
    """The config asks for a capability that is specified but not built yet."""


class RolloutError(RlftError):
    """A rollout engine, server or reward function failed."""


class TrainingInterrupted(RlftError):
    """Ctrl-C during training: a checkpoint was saved when there was progress to save."""


class TrainingDiverged(RlftError):
    """The loss became NaN or infinite."""


class Terminated(BaseException):
    """SIGTERM reached a training process (a launcher stopping every process when one failed, or a scheduler
    cancelling the job). A BaseException, like KeyboardInterrupt, so that no `except Exception` swallows it and every
    `finally` (servers, environments) still runs."""
