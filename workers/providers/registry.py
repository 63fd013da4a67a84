"""Which :class:`~punchline.workers.provider.ProviderKind` a ``[providers.<name>] kind`` names: an entry point of
the ``punchline.providers`` group (punchline's own kinds register there too, so the engine names none).

Read once per process and kept (a kind is looked up for every request's wire calls); a name not found makes
one fresh read (a package installed since, or a test's dist-info) before it is refused. Loading a kind imports
only its light module, never its SDK.
"""

from __future__ import annotations

from punchline.data.errors import ConfigError
from punchline.data.plugins import PROVIDER_KINDS
from punchline.data.provider_settings import ProviderSettings
from punchline.workers.batch_interface import BatchProvider
from punchline.workers.provider import KIND_GROUP, Provider, ProviderKind

_targets: dict[str, str] = {}
_loaded: dict[str, ProviderKind] = {}


def _read() -> dict[str, str]:
    global _targets
    _targets = PROVIDER_KINDS.targets()
    return _targets


def installed_kinds() -> list[str]:
    """Every kind a config may name: every installed package's."""
    return sorted(_targets or _read())


def _unknown(kind: str, record: str | None, file: str | None) -> ConfigError:
    return ConfigError(
        f"unknown provider kind {kind!r}: installed kinds {installed_kinds()} (a kind is a package's "
        f"{KIND_GROUP!r} entry point; `pip install punchline[litellm]` adds litellm)",
        file=file,
        record=record,
        field="kind",
    )


def kind_of(kind: str, *, record: str | None = None, file: str | None = None) -> ProviderKind:
    """The kind object of ``kind``; unknown, or not loadable, is one line naming ``file``, ``record`` and ``kind``."""
    found = _loaded.get(kind)
    if found is not None:
        return found
    target = (_targets or _read()).get(kind) or _read().get(kind)
    if target is None:
        raise _unknown(kind, record, file)
    value = PROVIDER_KINDS.load(kind, target, file=file, record=record, field="kind")
    if not isinstance(value, ProviderKind):  # a module: its KIND
        value = getattr(value, "KIND", value)
    if not isinstance(value, ProviderKind):
        raise ConfigError(
            f"provider kind {kind!r} ({target}) is not a punchline.workers.provider.ProviderKind",
            file=file,
            record=record,
            field="kind",
        )
    _loaded[kind] = value
    return value


def _no_batches(name: str, kind: str, file: str | None) -> ConfigError:
    return ConfigError(
        f'kind {kind!r} has no batch API: mode = "batch" cannot be used (set mode = "online")',
        file=file,
        record=f"providers.{name}",
        field="mode",
    )


def check_kind(name: str, settings: ProviderSettings, file: str | None = None) -> ProviderKind:
    """The kind of ``[providers.<name>]``, checked against what the table asks of it (a batch ``mode``)."""
    kind = kind_of(settings.kind, record=f"providers.{name}", file=file)
    if settings.mode == "batch" and not kind.has_batches:
        raise _no_batches(name, settings.kind, file)
    return kind


def make_provider(name: str, settings: ProviderSettings) -> Provider:
    """The provider of ``settings.kind`` named ``name`` (the ``[providers.<name>]`` table)."""
    return kind_of(settings.kind, record=f"providers.{name}").make(name, settings)


def make_batch_provider(name: str, settings: ProviderSettings) -> BatchProvider:
    """The batch API client of ``settings.kind``; a kind without one is one line naming ``mode`` (a stage's own
    ``mode = "batch"`` reaches here for a provider whose table says online)."""
    client = kind_of(settings.kind, record=f"providers.{name}").make_batches(name, settings)
    if client is None:
        raise _no_batches(name, settings.kind, None)
    return client
