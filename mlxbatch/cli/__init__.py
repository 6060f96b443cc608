"""The `mlxbatch` command line: a click group dispatching to one module per command group."""

from __future__ import annotations

import functools
import os
import platform
import re
import sys
import warnings
from importlib import metadata
from pathlib import Path

import click

from ..errors import SyntheticWeights, TemplateNote, UsageError, flag
from ..runtime import blas, cpu, files, interrupts
from .bench import bench, demo, doctor, tickets
from .classify import classify
from .common import fail
from .evaluate import evaluate_cmd
from .models import convert, init_random_cmd, models, parity
from .serve import bench_serve, serve


class Group(click.Group):
    """Turns the library's expected errors into one line and exit code 2, never a traceback."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except UsageError as e:
            fail(str(e.worded(flag)))
        except click.UsageError as e:  # bad options: one line too, not click's usage block
            fail(e.format_message())
        except BrokenPipeError:  # here, before click's main turns it into exit code 1
            broken_pipe()


def broken_pipe() -> None:
    """The reader of standard output went away (`mlxbatch classify ... | head`): exit quietly
    with 141 (128 + SIGPIPE, what a shell reports for a tool its pipe stopped), never 1, which
    means a --verify disagreement. Standard output goes to /dev/null so that the interpreter's
    last flush does not fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    sys.exit(141)


def version() -> str:
    """The installed package's version; a checkout that was never installed reads its pyproject."""
    try:
        return metadata.version("mlxbatch")
    except metadata.PackageNotFoundError:
        pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
        found = pyproject.is_file() and re.search(r'^version = "(.+)"', pyproject.read_text(), re.M)
        return found.group(1) if found else "unknown"


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        click.echo(f"mlxbatch {version()}")
        ctx.exit()


@click.group(cls=Group)
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_print_version,
    help="Show the version and exit.",
)
def cli() -> None:
    """Classify batches of short texts with a small instruction model in MLX."""


def _warns_of_the_blas(command: click.Command) -> click.Command:
    """`command`, saying first (once its options parsed: not for --help) that MLX's matmuls
    run on the reference BLAS, where that is so: only commands that compute say it, and only
    in the process's own command line (`main` asks with `obj`; an embedding caller did not
    choose the BLAS)."""
    callback = command.callback

    def run(*args, **kwargs):
        root = click.get_current_context().find_root().obj
        if isinstance(root, dict) and root.get("warn_blas"):
            if warning := blas.warning() or cpu.slow_coretype():
                click.echo(warning, err=True)
            if (problem := files.cache_problem()) and platform.system() == "Linux":
                click.echo(
                    f"note: {problem}: the BLAS probe and the planner's calibration are "
                    "redone by every run; set XDG_CACHE_HOME to a writable directory",
                    err=True,
                )
        return callback(*args, **kwargs)

    command.callback = functools.update_wrapper(run, callback)
    return command


COMPUTE = (classify, bench, demo, parity, serve, bench_serve)  # doctor reports the BLAS itself
for command in (
    classify,
    evaluate_cmd,
    convert,
    init_random_cmd,
    models,
    parity,
    bench,
    demo,
    doctor,
    tickets,
    serve,
    bench_serve,
):
    cli.add_command(_warns_of_the_blas(command) if command in COMPUTE else command)


def main() -> None:
    """The `mlxbatch` command: a signal at any moment of it, from the BLAS probe on, ends it
    with one line and 128 + the signal (runtime/interrupts.py)."""
    interrupts.install()
    try:
        code = _exit_code(_main)
    except KeyboardInterrupt:  # between a command's end and the line above
        code = _exit_code(lambda: fail("interrupted", 130))
    interrupts.ending()
    if interrupts.native_threads_running():  # a model still loading (serve interrupted)
        interrupts.exit_at_once(code)
    sys.exit(code)


def _exit_code(run) -> int:
    """`run`'s exit code: 0, or what it exited with; an interruption's 130 is 128 + the signal
    that caused it (143 for SIGTERM)."""
    try:
        run()
        return 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
        if isinstance(e.code, str):
            click.echo(e.code, err=True)
        return interrupts.exit_code() if code == 130 and interrupts.RECEIVED else code


def asks_for_text(args: list[str]) -> bool:
    """Whether the command line only asks for help or the version (`mlxbatch`, `mlxbatch
    --version`, `mlxbatch classify --help`): command names before it, no option taking a value
    that could be the flag's text."""
    if not args:
        return True
    words = []
    for arg in args:
        if arg in ("--help", "--version"):
            return arg == "--help" or not words
        if arg.startswith("-"):
            return False
        words.append(arg)
    return False


def format_note(message, category, filename, lineno, line=None) -> str:
    """A TemplateNote as one `note:` line; other warnings as Python formats them."""
    if issubclass(category, TemplateNote):
        return f"note: {message}\n"
    return _FORMAT_WARNING(message, category, filename, lineno, line)


_FORMAT_WARNING = warnings.formatwarning


def _main() -> None:
    try:
        files.hold_closed_streams()  # first: before any file is opened
        if not asks_for_text(sys.argv[1:]):  # --help and --version: no BLAS, no cache
            if why := blas.startup_problem():  # before OpenBLAS (ours or NumPy's) is loaded
                fail(why)
            blas.activate_in_process()  # before mlx is imported; computing commands warn if not
        warnings.filterwarnings("ignore", category=SyntheticWeights)  # the commands name it
        warnings.formatwarning = format_note
        cli(standalone_mode=False, obj={"warn_blas": True})
    except click.exceptions.Abort:  # click's own Ctrl-C handling (prompts)
        fail("interrupted", 130)
    except KeyboardInterrupt:
        fail("interrupted", 130)
    except click.UsageError as e:
        fail(e.format_message())
    except click.ClickException as e:
        fail(e.format_message(), e.exit_code)
    except UsageError as e:  # outside a command: `--help` into a closed standard output
        fail(str(e.worded(flag)))
    except BrokenPipeError:  # e.g. `mlxbatch classify ... | head`
        broken_pipe()
