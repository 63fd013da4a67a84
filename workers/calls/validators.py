"""Response validators named by :attr:`data.units.UnitSpec.check`.

A validator rejects an answer that parses badly *before* it is cached, by raising a retryable
error: the unit is retried a bounded number of times instead of poisoning the cache forever.

The engine knows no pipeline's validators: a unit names its own, ``"package.module:function"`` (called with the
response) or ``"package.module:function:ARG"`` (called with ``ARG`` and the response: the ids a reply must rate),
and the worker imports that module where it runs, as it imports the pipeline's other code. ``""`` only asks for a
non-empty answer, which every validator checks first. Whatever a validator raises that is not a provider error
is a malformed answer: retried, then the unit fails with that reason.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from functools import lru_cache

from punchline.data.errors import ProviderError, RetryableProviderError
from punchline.data.requests import ProviderResponse

Validator = Callable[[ProviderResponse], None]


def non_empty(response: ProviderResponse) -> None:
    if not response.texts:
        raise RetryableProviderError("provider returned no choices")


@lru_cache(maxsize=256)
def _function(module: str, name: str) -> Callable[..., object]:
    try:
        found = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise KeyError(f"response validator {module}:{name} cannot be loaded here: {exc}") from None
    if not callable(found):
        raise KeyError(f"response validator {module}:{name} is not a function")
    return found


def validator(name: str) -> Validator:
    """The check a unit names (see the module's docstring); KeyError naming it when it cannot be loaded."""
    if not name:
        return non_empty
    module, sep, rest = name.partition(":")
    function, _, arg = rest.partition(":")
    if not sep or not module or not function:
        raise KeyError(f"unknown response validator {name!r}: name one as 'package.module:function[:arg]'")
    check = _function(module, function)
    args: tuple[str, ...] = (arg,) if arg else ()

    def validate(response: ProviderResponse) -> None:
        non_empty(response)
        try:
            check(*args, response)
        except ProviderError:
            raise
        except Exception as exc:
            raise RetryableProviderError(f"the answer fails {module}:{function}: {exc}") from None

    return validate
