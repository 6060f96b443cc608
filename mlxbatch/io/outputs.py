"""Where an output may go, checked before anything is read or written: never the input (or a
link to it, or the file behind standard input), never over a directory or a device file by
rename; `-` is standard output, character devices and FIFOs are written straight."""

from __future__ import annotations

import importlib.util
import os
import stat
from pathlib import Path

from ..errors import OutputError
from ..runtime.files import CLOSED_STREAMS, oserror
from .ordered import OrderedStream
from .rows import output_format_of
from .sinks import is_journal, journal_path, lock_holder
from .sources import read_by_a_run
from .streams import is_stream, names_stdout, write_whole


def output_kind(output: Path) -> str:
    """ "stdout" for `-`, "stream" for character devices and FIFOs, else "file". A name whose
    suffix is a format mlxbatch does not write is refused (rows.output_format); a stream, written
    row by row as they finish, is JSONL: a name that says otherwise is refused too."""
    kind = _where(output)
    if kind == "stdout":
        return kind
    if output_format_of(output) != ("jsonl", False) and kind == "stream":
        raise OutputError(
            f"{output}: a device or FIFO is written as JSONL as rows finish, not "
            f"as its name's {''.join(output.suffixes[-2:])}; write to a regular "
            "file for CSV, TSV or gzip"
        )
    return kind


def _where(output: Path) -> str:
    if str(output) == "-":
        return "stdout"
    real = os.path.realpath(output)
    if is_stream(output) or real.startswith(("/dev/", "/proc/")) and os.path.exists(real):
        return "stream"  # /dev/stdout and friends: never a journal or a rename there
    _check_not_new_in_kernel_fs("-o", output, real)
    try:
        mode = os.stat(output).st_mode
    except FileNotFoundError:
        return "file"
    except OSError as e:
        raise oserror(output, e, "cannot be used as output") from None
    if stat.S_ISDIR(mode):
        raise OutputError(f"{output}: is a directory; -o takes a file path")
    if stat.S_ISCHR(mode) or stat.S_ISFIFO(mode):
        return "stream"
    if not stat.S_ISREG(mode):
        raise OutputError(f"{output}: not a regular file, a character device or a FIFO")
    return "file"


def _check_not_new_in_kernel_fs(option: str, path: Path, real: str) -> None:
    """Refuse a new file under /proc or /sys (what exists there is a stream) before any work:
    root's access check passes the folder."""
    if real.startswith(("/proc/", "/sys/")) and not os.path.exists(real):
        raise OutputError(
            f"{option} {path}: /{real.split('/')[1]} holds no new files; choose "
            f"another {option} path"
        )


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _same_path(a: Path, b: Path) -> bool:
    """The same file, or (when neither exists yet) the same path once links are resolved."""
    return _same_file(a, b) or os.path.realpath(a) == os.path.realpath(b)


def _overlap(writes: list[tuple[str, Path | None]], others: list[Path]):
    """The first (option, path, other) where a written `path` is one of `others`, or None."""
    for option, path in writes:
        for other in others if path is not None and str(path) != "-" else ():
            if _same_path(path, other):
                return option, path, other
    return None


def _stdout_is_one_of(inputs: list[Path]) -> Path | None:
    """The input that standard output writes into: only a regular file can be both (a terminal,
    /dev/null or a socket is both streams of many a run, and writing there destroys nothing)."""
    try:
        out = os.fstat(1)
    except OSError:
        return None
    if not stat.S_ISREG(out.st_mode):
        return None
    for path in inputs:
        try:
            if os.path.samestat(os.stat(path), out):  # /dev/stdin: the file stdin reads
                return path
        except OSError:
            continue
    return None


def check_output(output: Path | None, inputs: list[Path], resume: bool) -> str:
    """Refuse, before anything is read or written, an output that could destroy data; None:
    standard output, which a redirect may have opened on an input."""
    if output is None:
        if hit := _stdout_is_one_of(inputs):
            named = os.path.realpath(hit) if is_stream(hit) else hit  # /dev/stdin: its file
            raise OutputError(
                f"standard output is the input file {named} (a redirect onto it): "
                "the rows would be written into what the job reads; give -o "
                "another file"
            )
        return "stdout"
    check_stdout_open("-o", output)
    kind = output_kind(output)
    hit = _overlap([("-o", output), ("the journal of -o", journal_path(output))], inputs)
    if hit:
        role, candidate, path = hit
        raise OutputError(f"{role} ({candidate}) is the input file {path}; choose another -o")
    if kind != "file":
        if resume:
            raise OutputError(f"--resume needs a regular output file, not {output}")
        return kind
    parent = output.parent if str(output.parent) else Path(".")
    if not parent.exists():
        try:
            parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise oserror(parent, e, "cannot create the output directory") from None
    if not parent.is_dir():
        raise OutputError(f"{output}: {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputError(f"{output}: the directory {parent} is not writable")
    check_writable_file("-o", output)
    return kind


def _check_name(option: str, path: Path) -> None:
    """Refuse a name (or, for -o, its journal's) longer than its directory allows, before any
    work: found at the end, it would lose the run and block --resume."""
    parent = path.parent if str(path.parent) else Path(".")
    try:
        longest = max(os.pathconf(parent, "PC_NAME_MAX"), 14)
    except (OSError, ValueError):
        longest = 255
    name = journal_path(path).name if option == "-o" else path.name
    if len(os.fsencode(name)) > longest:
        raise OutputError(
            f"{option} {path}: the name{' of its journal' if option == '-o' else ''}"
            f" is longer than the {longest} bytes a name may have there; choose a "
            "shorter name"
        )


def check_writable_file(option: str, path: Path) -> None:
    """Refuse a regular file path that cannot be written, or whose writing would destroy
    another run's work: its journal, or a file another process holds locked."""
    _check_name(option, path)
    _check_not_in_a_model(option, path)
    if not path.exists():
        return
    if not os.access(path, os.W_OK):
        raise OutputError(f"{option} {path}: exists and is not writable")
    if is_journal(path):
        raise OutputError(
            f"{option} {path} is the journal of another mlxbatch run; choose another {option} path"
        )
    pid = lock_holder(path)
    if pid:
        raise OutputError(
            f"{option} {path} is locked by another process (pid {pid}); choose "
            f"another {option} path"
        )
    if read_by_a_run(path):
        raise OutputError(
            f"{option} {path} is being read by another mlxbatch run (as its "
            f"input); choose another {option} path"
        )


PLOT_SUFFIXES = (".png", ".svg", ".pdf", ".jpg", ".jpeg")


def check_model_untouched(writes: list[tuple[str, Path | None]], model_dir: Path) -> None:
    """Refuse an output (`(option, path)` pairs) that would land in the directory of the model
    the run loads, or under it, through any link: it would replace one of the model's files or
    become one (a new `chat_template.jinja` or `*.safetensors` there is read by every later
    run)."""
    root = os.path.realpath(model_dir)
    for option, path in writes:
        if path is None or str(path) == "-":
            continue
        real = os.path.realpath(path)
        if real == root or real.startswith(root.rstrip(os.sep) + os.sep):
            raise OutputError(
                f"{option} {path} is inside the model directory {model_dir}; "
                f"mlxbatch writes nothing there: choose another {option} path"
            )


def _check_not_in_a_model(option: str, path: Path) -> None:
    """Refuse an output that lands in any model's directory (weights there, or its config and
    tokenizer), existing or new: a new file there may become part of that model."""
    real = Path(os.path.realpath(path))
    if not real.is_dir() and _of_a_model(real):
        raise OutputError(
            f"{option} {path}: would be a file of a model (in {real.parent}, "
            f"beside its config and weights); mlxbatch writes nothing there: "
            f"choose another {option} path"
        )


# What an existing report file starts with, by the name's suffix: anything else (a link onto
# model weights, a document) is not replaced by a report.
REPORT_MAGIC = {
    ".json": (b"{", b"["),
    ".png": (b"\x89PNG",),
    ".pdf": (b"%PDF",),
    ".svg": (b"<",),
    ".jpg": (b"\xff\xd8",),
    ".jpeg": (b"\xff\xd8",),
}


def _of_a_model(real: Path) -> bool:
    """A file in a model's directory (weights beside it, or its config and tokenizer): `--json
    m/config.json` began with "{" as a report does, was replaced, and m no longer loaded."""
    d = real.parent
    return (
        any(d.glob("*.safetensors"))
        or (d / "config.json").is_file()
        and (d / "tokenizer.json").is_file()
    )


def _check_replaceable_report(option: str, path: Path) -> None:
    """An existing --json/--plot file (through any link) must be a report of that kind, and no
    file of a model."""
    if not os.path.isfile(path) or os.path.getsize(path) == 0:
        return
    real = Path(os.path.realpath(path))
    try:
        with open(path, "rb") as f:
            head = f.read(64).lstrip()
    except OSError:
        return  # check_writable_file has spoken
    magic = REPORT_MAGIC.get(path.suffix.lower(), ())
    if not any(head.startswith(m) for m in magic):
        where = f" (it is {real})" if str(real) != os.path.abspath(path) else ""
        kind = f"{path.suffix} report" if path.suffix else "report"  # `--json -`: "a  report"
        raise OutputError(
            f"{option} {path}: exists and is not a {kind}{where}; "
            "mlxbatch will not replace it: move it away or choose another path"
        )
    if _of_a_model(real):
        raise OutputError(
            f"{option} {path}: exists and is a file of a model ({real}); "
            "mlxbatch will not replace it: choose another path"
        )


def check_stdout_open(option: str, path: Path | None) -> None:
    """A closed standard output is /dev/null: refuse what `option` would write there (`path` None:
    standard output itself), lost without a word otherwise."""
    if 1 in CLOSED_STREAMS and (path is None or names_stdout(path)):
        raise OutputError(
            f"{option} {path or '-'}: standard output is closed (>&-): what it "
            "would write would be lost; give a file"
        )


def check_reports(
    json_path: Path | None,
    plot_path: Path | None,
    protected: list[Path],
    stdout_holds: str | None = None,
) -> None:
    """Refuse, before anything is computed, a --json/--plot path that would overwrite an input,
    the output or its journal (`protected`) or the other report, or that cannot be written;
    or that names standard output where `stdout_holds` (what else goes there) is given."""
    reports = [(p, o) for p, o in ((json_path, "--json"), (plot_path, "--plot")) if p is not None]
    for path, option in reports:
        if stdout_holds and names_stdout(path):
            raise OutputError(
                f"{option} {path}: standard output holds {stdout_holds}; give "
                f"{option} a file, or -o a file"
            )
    if len(reports) == 2 and _same_path(json_path, plot_path):
        raise OutputError(f"--json and --plot are both {json_path}; give them different paths")
    hit = _overlap([(o, p) for p, o in reports], protected)
    if hit:
        option, path, other = hit
        raise OutputError(
            f"{option} {path} would overwrite {other}, which this run reads or "
            f"writes; choose another {option} path"
        )
    if plot_path is not None and importlib.util.find_spec("matplotlib") is None:
        raise OutputError(
            "--plot needs matplotlib: pip install 'mlxbatch[plot]' (checked before "
            "anything is computed)"
        )
    for path, option in reports:
        check_stdout_open(option, path)
        _check_name(option, path)
        if option == "--plot" and path.suffix.lower() not in PLOT_SUFFIXES:
            raise OutputError(f"--plot {path}: the name must end in {', '.join(PLOT_SUFFIXES)}")
        if path.is_dir():
            raise OutputError(f"{option} {path}: is a directory; give a file path")
        parent = path.parent if str(path.parent) else Path(".")
        if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
            raise OutputError(
                f"{option} {path}: the directory {parent} does not exist or is not writable"
            )
        if not is_stream(path):
            _check_not_new_in_kernel_fs(option, path, os.path.realpath(path))
            check_writable_file(option, path)
            _check_replaceable_report(option, path)


def write_json_report(path: Path, data: dict) -> None:
    """Write a --json report whole or not at all, as the output is written."""
    import json

    path = Path(path)
    text = json.dumps(data, indent=2, default=str) + "\n"
    write_whole(path, lambda f: f.write(text))  # a stream (/dev/stdout) is written straight


def open_stream(output: Path, n_rows: int, labels: tuple[str, ...], header: dict) -> OrderedStream:
    """Standard output, or a character device / FIFO opened for writing (always JSONL)."""
    if str(output) == "-":
        return OrderedStream(n_rows, labels, header)
    try:
        # appending: /dev/stdout into a `>>` redirect keeps what the file held
        stream = open(output, "a", encoding="utf-8", newline="")  # noqa: SIM115
    except OSError as e:
        raise oserror(output, e) from None
    return OrderedStream(n_rows, labels, header, stream)
