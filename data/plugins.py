"""What installed packages add to punchline: one typed reader for every plug-in group.

A pipeline, a provider kind and a command family are each found the same way: an entry point of the package
that ships it, in the group named here (punchline's own built-ins register there too, so the engine names none).
Each group is spelled once, here; its consumers (``cluster/registry.py`` for pipelines, the simulated provider's
``simulate`` hooks, ``workers/providers/registry.py`` for kinds, ``cluster/commands`` for command families) ask
it for the installed targets and load one through :meth:`PluginGroup.load`, which turns any import error of a
plug-in into one line naming it (a plug-in's bug is never a traceback).
"""

from __future__ import annotations

import importlib
import importlib.metadata

import msgspec

from punchline.data.errors import ConfigError


class PluginGroup(msgspec.Struct, frozen=True):
    """An entry-point group and how its members are named in an error (``what``)."""

    name: str
    what: str

    def targets(self) -> dict[str, str]:
        """Installed members: entry-point name -> ``module:attr`` (read afresh: a package installed since, or a
        test's dist-info, is seen)."""
        return {ep.name: ep.value for ep in importlib.metadata.entry_points(group=self.name)}

    def load(self, name: str, target: str, *, file: str | None = None, record: str | None = None, field: str) -> object:
        """The object ``target`` (``module:attr``, or a module) names; one ConfigError naming ``name``, the
        target, ``file``, ``record`` and ``field`` when it cannot be imported or has no such attribute."""
        module_name, _, attr = target.partition(":")
        try:
            module = importlib.import_module(module_name)
        except Exception as exc:  # a plug-in's own import error, whatever it is, is one line naming it
            raise ConfigError(
                f"{self.what} {name!r} ({target}) cannot be loaded: {type(exc).__name__}: {exc}",
                file=file,
                record=record,
                field=field,
            ) from None
        if not attr:
            return module
        try:
            return getattr(module, attr)
        except AttributeError:
            raise ConfigError(
                f"{self.what} {name!r} ({target}): module {module_name!r} has no {attr!r}",
                file=file,
                record=record,
                field=field,
            ) from None


PIPELINES = PluginGroup("punchline.pipelines", "pipeline")
PROVIDER_KINDS = PluginGroup("punchline.providers", "provider kind")
COMMANDS = PluginGroup("punchline.commands", "command family")
