"""The errors vitkit explains: one family, so that callers catch ``VitkitError`` and the command line
prints the message as one line. Each subclasses the built-in error a caller would otherwise expect."""

import json
import sys
from typing import Any


class VitkitError(Exception):
    """An error whose message alone tells the user what was wrong and what was expected."""


class ConfigError(VitkitError, ValueError):
    """A configuration or recipe field has a value of the wrong type or out of range."""


class InputError(VitkitError, ValueError):
    """A tensor given to a model does not have the shape or dtype it expects."""


class CheckpointError(VitkitError, ValueError):
    """A checkpoint is missing, corrupt, of an unsupported family, or does not fit the model it describes."""


class FormatError(ConfigError, CheckpointError):
    """The chosen file format cannot hold the model (a choice to change: another format can)."""


class DatasetError(VitkitError, ValueError):
    """A dataset is missing, empty, or holds files that are not what its format promises."""


class DatasetNameError(ConfigError, DatasetError):
    """A dataset named in no form vitkit reads (a choice to change, as a bad flag value is)."""


class DeviceError(VitkitError, RuntimeError):
    """The requested device or precision is not available on this machine."""


class TrainingDiverged(VitkitError, RuntimeError):
    """The loss or the gradient became NaN or infinite; the last good checkpoint is left as it was."""


def abridged(value: Any, limit: int = 80) -> str:
    """``repr(value)`` cut to about ``limit`` characters: how a message quotes a bad value of any size."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + " ..."


def parse_json(text: str | bytes) -> Any:
    """``json.loads``, where arrays or objects nested deeper than the parser goes (Python's RecursionError) and
    integers longer than Python converts fail as any other text that is not JSON does: with
    ``json.JSONDecodeError``, a ValueError."""
    try:
        return json.loads(text)
    except RecursionError:
        raise json.JSONDecodeError("nested deeper than the JSON parser goes", "", 0) from None
    except ValueError as error:
        if isinstance(error, (json.JSONDecodeError, UnicodeDecodeError)):
            raise
        raise json.JSONDecodeError(f"an integer of more than {sys.get_int_max_str_digits()} digits", "", 0) from None
