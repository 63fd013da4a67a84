"""The command line's index: ``punchline --help`` lists every command without importing one, and
``punchline CMD`` imports only the module that registers CMD."""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys
import textwrap
from pathlib import Path

from punchline.cluster.cli import commands
from punchline.cluster.cli.main import build_parser, command_modules, main, package_version


def _registered(module: str) -> dict[str, str | None]:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    importlib.import_module(commands.module_path(module)).register(sub)
    return {a.dest: a.help for a in sub._choices_actions}


def test_the_index_names_every_command_of_every_module_with_its_help() -> None:
    seen: dict[str, str | None] = {}
    index = commands.index()
    for module in command_modules():
        for name, help_text in _registered(module).items():
            assert name in index, f"{module} registers {name!r}, which the index lacks"
            assert index[name].module == module, f"the index puts {name!r} in {index[name].module}"
            assert help_text == index[name].help, f"{module}'s {name!r} spells its own help line"
            seen[name] = help_text
    assert set(seen) == set(index), f"index entries no module registers: {set(index) - set(seen)}"


def test_the_pipelines_commands_come_from_their_entry_points() -> None:
    """`punchline puns`, `humor` and `import-legacy` are the built-in pipelines' own, found as a plug-in's are."""
    index = commands.index()
    assert not {"puns", "humor", "import-legacy"} & set(commands.INDEX)
    assert index["puns"].module == index["import-legacy"].module == "punchline.pipelines.puns.commands"
    assert index["humor"].module == "punchline.pipelines.humor.commands"


def test_the_whole_parser_still_parses_every_command() -> None:
    args = build_parser().parse_args(["status", "some-run", "--json"])
    assert args.command == "status" and args.run_id == "some-run" and args.json


def _modules_after(argv: list[str]) -> set[str]:
    code = (
        "import sys, json\nfrom punchline.cluster.cli.main import main\n"
        f"try:\n    main({argv!r})\nexcept SystemExit:\n    pass\n"
        "print(json.dumps(sorted(sys.modules)), file=sys.stderr)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    return set(json.loads(out.stderr.strip().splitlines()[-1]))


def test_help_imports_no_command_module_and_no_heavy_library() -> None:
    loaded = _modules_after(["--help"])
    assert not {m for m in loaded if m.startswith("punchline.cluster.cli.commands.")}
    light = {f"punchline.pipelines.{p}{cli}" for p in ("puns", "humor") for cli in ("", ".cli")}
    assert {m for m in loaded if m.startswith("punchline.pipelines.")} <= light  # their index, no stage
    heavy = {"ray", "redis", "structlog", "rich", "openai", "anthropic", "boto3", "matplotlib", "pyarrow", "jinja2"}
    assert not heavy & {m.partition(".")[0] for m in loaded}


def test_a_command_imports_only_its_own_module() -> None:
    loaded = _modules_after(["settings", "--help"])
    ours = {m.rpartition(".")[2] for m in loaded if m.startswith("punchline.cluster.cli.commands.")}
    assert {m for m in ours if not m.startswith("_")} == {"settings"}  # `_tables` is a helper, not a command


def test_the_read_only_commands_import_none_of_the_engine_that_writes_runs() -> None:
    for command in ("status", "runs"):
        loaded = _modules_after([command, "--help"])
        engine = {"punchline.cluster.run.driver", "punchline.cluster.run.coordinator", "punchline.cluster.registry"}
        assert not engine & loaded, f"{command}: {sorted(engine & loaded)}"
        assert not {"ray", "openai", "anthropic", "matplotlib"} & {m.partition(".")[0] for m in loaded}, command


def test_help_lists_every_command(capsys: object) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "punchline", "--help"], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    for name in commands.index():
        assert name in out


def test_version_prints_the_installed_version() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "punchline", "--version"], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == f"punchline {package_version()}"
    assert package_version()[0].isdigit()


def test_a_mistyped_command_is_one_usage_error() -> None:
    try:
        main(["no-such-command"])
    except SystemExit as exc:
        assert exc.code == 2
    else:
        raise AssertionError("a mistyped command must exit 2")


def test_the_script_ends_after_its_threads_and_atexit_handlers_with_main_s_code(tmp_path: Path) -> None:
    """``entry`` ends the process without the interpreter's teardown, but only after what that teardown would wait
    for: another thread still writing, the atexit handlers (a log's flush, a server's stop), stdout's buffer."""
    script = textwrap.dedent(
        f"""
        import atexit, sys, threading, time
        from pathlib import Path
        from punchline.cluster.cli import main as cli

        def late_write() -> None:
            time.sleep(0.5)
            Path({str(tmp_path / "late.txt")!r}).write_text("written")

        threading.Thread(target=late_write).start()  # not a daemon: the process waits for it
        atexit.register(lambda: print("atexit ran"))
        sys.argv = ["punchline", "runs", "--runs-dir", {str(tmp_path / "runs")!r}]
        cli.entry()
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.rstrip().endswith("atexit ran") and len(done.stdout.splitlines()) >= 2
    assert (tmp_path / "late.txt").read_text() == "written"
    bad = subprocess.run(
        [sys.executable, "-c", script.replace('"runs", "--runs-dir"', '"status", "no-such-run", "--runs-dir"')],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and bad.stderr.startswith("punchline: error:")  # main's code, its one line
