"""`mlxbatch serve` and `mlxbatch bench-serve`: thin; the service is in serve/, the load test
in bench/serve_load.py."""

from __future__ import annotations

from pathlib import Path

import click

from ..io.caps import API_KEY_BYTES, read_capped
from ..model.defaults import model_dir
from .common import (
    FiniteRange,
    by_name,
    echo,
    fail,
    label_options,
    max_batch_option,
    model_option,
    plot_target,
    prompt_options,
    read_prompt,
    report_options,
)

BOM = b"\xef\xbb\xbf"
SERVES_ON = ("starlette", "uvicorn", "prometheus_client")  # the `serve` extra; its load test: httpx


def need_serve_extra(modules: tuple[str, ...] = SERVES_ON) -> None:
    """The service and its load test run on the `serve` extra: without it, one line naming
    what to install (the import deep inside was a traceback)."""
    import importlib.util

    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        fail(
            f"this command needs the serve extra ({', '.join(missing)} missing): "
            "pip install 'mlxbatch[serve]'"
        )


# The service subclasses uvicorn's private H11Protocol (serve/connections.py): a uvicorn past
# the versions it is tested with may change what it overrides, so another one is refused.
UVICORN_RANGE = ((0, 29), (0, 56))


def need_uvicorn(found: str | None = None) -> None:
    """One line and exit 2 when the installed uvicorn is outside `UVICORN_RANGE`."""
    import importlib.metadata
    import re

    found = found or importlib.metadata.version("uvicorn")
    low, high = (".".join(map(str, v)) for v in UVICORN_RANGE)
    parts = re.match(r"(\d+)\.(\d+)", found)
    if parts is None or not UVICORN_RANGE[0] <= tuple(map(int, parts.groups())) < UVICORN_RANGE[1]:
        fail(
            f"mlxbatch serve needs uvicorn >={low},<{high} (found {found}): "
            f"pip install 'uvicorn>={low},<{high}'"
        )


def read_api_key(path: Path) -> bytes:
    try:
        # an editor's UTF-8 byte-order mark is not part of the key: kept, it is invisible
        # and every request is a 401
        key = read_capped(path, API_KEY_BYTES, "--api-key-file").removeprefix(BOM).strip()
    except OSError as e:
        fail(f"--api-key-file {path}: cannot read it ({e.strerror or e})")
    if not key:
        fail(f"--api-key-file {path}: the file is empty")
    if any(b < 0x21 or b == 0x7F for b in key):  # a header cannot carry it
        fail(f"--api-key-file {path}: the key holds a space or a control character")
    return key  # compared as bytes: a non-ASCII key matches the UTF-8 a client sends


def access_key(options: dict) -> bytes | None:
    """The API key, once the options that decide who may reach the service are checked; a
    warning when it serves beyond this machine."""
    from ..serve.server import LOOPBACK

    if options["max_inputs"] > options["max_queue"]:
        fail(
            f"--max-inputs-per-request {options['max_inputs']} is over --max-queue "
            f"{options['max_queue']}: such a request could never be queued"
        )
    key = read_api_key(options["api_key_file"]) if options["api_key_file"] else None
    if options["host"] not in LOOPBACK:
        echo(
            f"warning: --host {options['host']} serves beyond this machine"
            + ("" if key else "; anyone who can reach it may classify (see --api-key-file)")
        )
    return key


def server_units(options: dict) -> dict:
    """The options typed in human units (MB, ms), in the units the server counts in."""
    from ..serve.limits import MB

    return {
        "max_body_bytes": int(options["max_body_mb"] * MB),
        "max_wait_s": options["max_wait_ms"] / 1000,
    }


@click.command()
@model_option
@label_options
@prompt_options
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to bind; anything but the loopback prints a warning.",
)
@click.option("--port", type=click.IntRange(0, 65535), default=8765, show_default=True)
@click.option(
    "--max-wait-ms",
    type=FiniteRange(0, 60_000),
    default=5.0,
    show_default=True,
    help="How long the oldest queued item waits for others to batch with.",
)
@click.option(
    "--batch-tokens", type=click.IntRange(1), help="Padded tokens per batch (default: as classify)."
)
@max_batch_option
@click.option(
    "--max-queue",
    type=click.IntRange(1),
    default=1024,
    show_default=True,
    help="Items waiting at most; past it requests get 429 with Retry-After.",
)
@click.option(
    "--max-inputs-per-request",
    "max_inputs",
    type=click.IntRange(1),
    default=256,
    show_default=True,
    help="Texts in one request; past it 413.",
)
@click.option(
    "--max-tokens",
    type=click.IntRange(1),
    default=2048,
    show_default=True,
    help="Tokens an item may feed (within the model's context); past it 422, or "
    'cut with "truncate": true in the request.',
)
@click.option(
    "--max-body-mb",
    type=FiniteRange(0, min_open=True),
    default=2.0,
    show_default=True,
    help="Request body cap; past it 413.",
)
@click.option(
    "--timeout-header",
    "header_s",
    type=FiniteRange(0, min_open=True),
    default=10.0,
    show_default=True,
    help="Seconds for a request's head (from connect, or from "
    "the previous reply); then 408 and the connection closes.",
)
@click.option(
    "--timeout-body",
    "body_s",
    type=FiniteRange(0, min_open=True),
    default=30.0,
    show_default=True,
    help="Seconds for a request's whole body; then 408.",
)
@click.option(
    "--timeout-keep-alive",
    "keep_alive_s",
    type=FiniteRange(0, min_open=True),
    default=5.0,
    show_default=True,
    help="Seconds an idle connection stays open between requests.",
)
@click.option(
    "--timeout-reply",
    "reply_s",
    type=FiniteRange(0, min_open=True),
    default=30.0,
    show_default=True,
    help="Seconds a client may leave its replies unread (its "
    "socket's buffer full); then the connection is dropped.",
)
@click.option(
    "--max-connections",
    type=click.IntRange(1),
    default=512,
    show_default=True,
    help="Connections open at once; past it a new one gets 503 and is closed.",
)
@click.option(
    "--drain-timeout",
    "drain_s",
    type=FiniteRange(0),
    default=30.0,
    show_default=True,
    help="Seconds after SIGTERM/Ctrl-C to finish in-flight requests; then the rest are "
    "dropped and the server exits.",
)
@click.option(
    "--api-key-file",
    type=click.Path(path_type=Path),
    help="Require 'Authorization: Bearer <the key in this file>' on /v1/*.",
)
@click.option(
    "--verify-sample",
    type=FiniteRange(0, 1),
    default=0.0,
    show_default=True,
    help="Fraction of items re-scored on the gold loop while idle.",
)
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"]),
    default="info",
    show_default=True,
)
@click.option(
    "--questions",
    type=click.Path(path_type=Path),
    help="YAML/JSON file of questions: each text is answered with every one.",
)
@click.option(
    "--tag-threshold",
    type=FiniteRange(0, 1),
    help="Multi-label questions: a tag is on at P(yes) >= this (default 0.5).",
)
def serve(**options):
    """Serve classification over HTTP (POST /v1/classify), batching what arrives."""
    need_serve_extra()
    need_uvicorn()
    key = access_key(options)
    options = dict(options)
    prompt = read_prompt(options)
    path = model_dir(options["model"], echo)
    serve_spec = _serve_spec(options, prompt, path)
    _listen_and_serve(serve_spec, options, key)


def _serve_spec(options: dict, prompt, path: Path):
    """The service's spec: the options by name, the prompt, the model and the limits."""
    from ..serve.limits import Limits
    from ..serve.service import ServeSpec

    limits = by_name(Limits, options, **server_units(options))
    return by_name(
        ServeSpec,
        options,
        model=path,
        name=options["model"] or path.name,
        prompt=prompt,
        limits=limits,
    )


def _listen_and_serve(serve_spec, options: dict, key: bytes | None) -> None:
    """Everything that can be refused is refused before the port or a thread; then serve until
    a signal, exiting as the server ends."""
    from ..errors import UsageError, flag
    from ..serve.connection_limits import ConnectionLimits, reserve_descriptors
    from ..serve.server import listen
    from ..serve.server import serve as run
    from ..serve.service import Service, preflight

    connections = by_name(ConnectionLimits, options)
    if problem := reserve_descriptors(connections.max_connections):
        fail(problem)
    try:
        preflight(serve_spec)
        sock = listen(options["host"], options["port"])
    except UsageError as e:
        fail(str(e.worded(flag)))
    service = Service(serve_spec)
    code = run(service, sock, key, connections, options["log_level"])
    if code == 130:
        fail("interrupted", 130)
    if code:
        fail(f"the model did not load: {service.failure}", code)


@click.command("bench-serve")
@model_option
@click.option(
    "--tickets",
    "n",
    type=click.IntRange(1),
    default=400,
    show_default=True,
    help="Synthetic tickets (the classify baseline and the requests' texts).",
)
@click.option(
    "--mix",
    type=click.Choice(["default", "short", "long", "heavy-tail"]),
    default="default",
    show_default=True,
)
@click.option(
    "--loads",
    default="0.25,0.5,0.7,0.9,1.2,2.0",
    show_default=True,
    help="Offered rates, as multiples of classify --mode sorted's items/s.",
)
@click.option(
    "--seconds",
    type=FiniteRange(0.5),
    default=10.0,
    show_default=True,
    help="Arrivals at each load.",
)
@click.option(
    "--sequential",
    type=click.IntRange(1),
    default=40,
    show_default=True,
    help="Requests sent one at a time (the latency baseline).",
)
@click.option(
    "--soak-seconds",
    type=FiniteRange(0),
    default=0.0,
    show_default=True,
    help="Then this long at 70% of capacity (600 for a ten-minute soak).",
)
@click.option("--max-queue", type=click.IntRange(1), default=256, show_default=True)
@report_options("every figure", "bench-serve")
@click.option("--quick", is_flag=True, help="Tiny synthetic model, 2 s a load: checks the command.")
def bench_serve(
    model, n, mix, loads, seconds, sequential, soak_seconds, max_queue, json_path, plot_path, quick
):
    """Load-test `mlxbatch serve`: open-loop arrivals at several rates against classify."""
    need_serve_extra((*SERVES_ON, "httpx"))
    import tempfile

    from ..bench.serve_load import LoadOptions, format_report, plot, run
    from ..bench.workload import generate
    from ..io.outputs import check_model_untouched, check_reports, write_json_report
    from ..io.streams import report_stream

    rates = load_rates(loads)
    plot_path = plot_target(plot_path, json_path, "bench-serve")
    check_reports(json_path, plot_path, [])
    tmp = tempfile.TemporaryDirectory()
    if quick:
        model = quick_model(Path(tmp.name))
        n, seconds, sequential = min(n, 60), min(seconds, 2.0), min(sequential, 10)
    texts = tuple(r["text"] for r in generate(n, seed=0, mix=mix))
    path = model_dir(model, echo)
    check_model_untouched([("--json", json_path), ("--plot", plot_path)], path)
    options = LoadOptions(
        model=path,
        texts=texts,
        loads=rates,
        seconds=seconds,
        sequential=sequential,
        soak_seconds=soak_seconds,
        max_queue=max_queue,
    )
    result = run(options, progress=echo)
    tmp.cleanup()
    click.echo(format_report(result), file=report_stream(json_path))
    if json_path:
        write_json_report(json_path, result)
    if plot_path:
        plot(result, plot_path)


def load_rates(loads: str) -> tuple[float, ...]:
    """`--loads 0.5,1,2` as multiples of capacity, each above 0."""
    try:
        rates = tuple(float(x) for x in loads.split(",") if x.strip())
    except ValueError:
        fail(f"--loads {loads!r}: give comma-separated multiples of capacity, e.g. 0.5,1,2")
    if not rates or min(rates) <= 0:
        fail(f"--loads {loads!r}: give at least one multiple above 0")
    return rates


def quick_model(tmp: Path) -> str:
    """`--quick`'s tiny random model, written under `tmp`."""
    from ..model.convert import init_random

    model = str(tmp / "tiny")
    init_random(model, preset="tiny", seed=0, dtype="float32")
    return model
