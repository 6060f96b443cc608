"""`classify` as one library call: check every path, read the input, load the model, run the
job (in one process or over ranks), report. The CLI only turns its options, by name, into a
`JobRequest` (its prompt read and checked once, a `PromptSpec`) and a `RunSpec`."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..api.classifier import Classifier
from ..api.spec import RunSpec
from ..engine.promptspec import PromptSpec
from ..errors import InputError, JobError
from ..io.inputs import read_rows
from ..io.outputs import check_model_untouched, check_output, check_reports
from ..io.rows import output_format
from ..io.sinks import journal_path
from ..io.windows import JobInput
from ..model.defaults import model_dir
from .distributed import Cluster, RankGroup
from .job import run_job
from .result import JobResult


@dataclass(frozen=True)
class JobRequest:
    """Everything `classify` was told besides the run spec: what to read, load and write."""

    input: str
    model: str | None = None
    prompt: PromptSpec = field(default_factory=PromptSpec)  # labels, system prompt, ...
    # the files the prompt was read from, by option (`--examples`: path), kept from the writes
    prompt_files: dict[str, Path] = field(default_factory=dict)
    output: Path | None = None  # None: standard output
    text_field: str = "text"
    id_field: str | None = None
    input_format: str = "auto"
    resume: bool = False
    verify: bool = False
    dtype: str | None = None
    check_weights: bool = False
    prefix_cache: bool = True
    gold_field: str | None = None
    json_path: Path | None = None
    plot_path: Path | None = None
    distributed: bool = False
    collective_timeout: float = 600.0

    def reads(self) -> list[Path]:
        """Every file the run reads, kept safe from its writes."""
        paths = (self.input, *self.prompt_files.values())
        return [Path("/dev/stdin" if str(p) == "-" else p) for p in paths if p]

    def check_stdin(self) -> None:
        check_stdin({"INPUT": self.input} | self.prompt_files)


def check_stdin(named: dict) -> None:
    """Standard input read by one option at most (`named`: option -> path): the first to read
    it takes it all, and the next found it empty ("empty input (no rows)" for INPUT after
    `--examples -`)."""
    dashes = [name for name, p in named.items() if p is not None and str(p) == "-"]
    if len(dashes) > 1:
        both = "both" if len(dashes) == 2 else "all"
        raise JobError(
            f"{' and '.join(dashes)} {both} read standard input (-): standard "
            "input can be read once; give all but one of them a file"
        )


class Interrupted(Exception):
    """Ctrl-C or SIGTERM stopped the job; the message says how to continue."""


def run_classify(request: JobRequest, spec: RunSpec, say: Callable[[str], None]) -> int:
    """The whole classify command; returns its exit code (1 when --verify disagrees)."""
    req = request
    req.check_stdin()
    group = _group(req)
    rank = group.rank if group else 0
    kind = check_paths(req, rank)
    check_questions(req)
    writes_as = output_format(str(req.output))[0] if req.output is not None else "jsonl"
    rows, fmt = _input(req, writes_as)
    clf = None
    try:  # from here the input is held (JobInput): released however the job ends
        clf = _load(req, rank, say)
        output = req.output if rank == 0 else None
        kept = bool(req.gold_field)
        result = run_job(
            clf, rows, spec, output, req.resume, req.verify, req.input, fmt, kept, group
        )
        if result is None:  # ranks other than 0 write nothing
            return 0
    except KeyboardInterrupt:
        raise interrupted(req.output if kind == "file" else None) from None
    finally:
        if isinstance(rows, JobInput):
            rows.close()  # the job's input may be written again
    return report(clf, rows, result, req, say)


def _group(req: JobRequest) -> RankGroup | None:
    """The ranks sharing the job; None: this process alone."""
    if req.distributed or os.environ.get("MLX_RANK") is not None:  # set by mlx.launch
        cluster = Cluster.join(req.distributed, req.collective_timeout)
        return RankGroup(cluster) if cluster else None
    return None


def check_paths(req: JobRequest, rank: int) -> str:
    """The options' paths checked before anything is read or written (the files themselves on
    rank 0, which writes them); what the output is ("file" or "stdout")."""
    if req.resume and req.output is None:
        raise JobError("--resume needs -o/--output (the journal lives next to it)")
    reads = req.reads()
    kind = check_output(req.output, reads, req.resume) if rank == 0 else "stdout"
    if (req.json_path or req.plot_path) and not req.gold_field:
        raise JobError("--json and --plot report the evaluation: give --gold-field too")
    if rank == 0:
        written = [req.output, journal_path(req.output)] if req.output is not None else []
        rows = None if req.output is not None else "the rows (no -o)"
        check_reports(req.json_path, req.plot_path, reads + written, rows)
    return kind


def _load(req: JobRequest, rank: int, say: Callable[[str], None]) -> Classifier:
    """The model, once rank 0 has checked that no output lands among its files."""
    path = model_dir(req.model, say)
    if rank == 0:
        journal = req.output and journal_path(req.output)
        outputs = [("-o", req.output), ("-o's journal", journal)]
        outputs += [("--json", req.json_path), ("--plot", req.plot_path)]
        check_model_untouched(outputs, path)
    return Classifier.load(
        path,
        dtype=req.dtype,
        prefix_cache=req.prefix_cache,
        check_finite=req.check_weights,
        prompt=req.prompt,
    )


def _input(req: JobRequest, writes_as: str):
    """(rows, format): every row for an evaluation, else the input read in windows."""
    if req.gold_field:  # the evaluation holds every row
        rows, fmt = read_rows(
            req.input,
            req.text_field,
            req.id_field,
            req.input_format,
            (req.gold_field,) if req.gold_field else (),
            writes_as,
        )
        if req.gold_field and not any(req.gold_field in row.fields for row in rows):
            raise InputError(
                f"{req.input}: no row has the gold field {req.gold_field!r} (--gold-field)"
            )
    else:  # read in windows, twice (a scan, then the job): memory flat in the input's length
        rows = JobInput.of_file(
            req.input, req.text_field, req.id_field, req.input_format, (), writes_as
        )
        fmt = rows.fmt
    return rows, fmt


def check_questions(req: JobRequest) -> None:
    """A questions run's gold: each question's own field, which `eval` reads."""
    if req.prompt.questions is not None and req.gold_field:
        raise JobError(
            "--gold-field and --questions: each question's gold is the input's field "
            "of its name; evaluate the output with `mlxbatch eval INPUT OUTPUT "
            "--questions FILE`"
        )


def interrupted(output: Path | None) -> Interrupted:
    """Why the job stopped, and how to go on where its journal (beside `output`, a file) holds
    finished batches: before the job made it, there is none to resume."""
    if output is not None and journal_path(output).exists():
        return Interrupted(
            f"interrupted; finished batches are saved in {journal_path(output)}. "
            "Run the same command with --resume to continue."
        )
    return Interrupted("interrupted")


def report(clf: Classifier, rows, result: JobResult, req: JobRequest, say) -> int:
    """The summary, the adjustment, the evaluation and the verification; the exit code."""
    say(f"model: {clf.lm.describe()}")
    say(result.summary())
    if req.output is not None:  # where the rows went (standard output needs no name)
        say(f"output: {req.output}")
    if not clf.adjust.identity:
        say(f"adjustment: {clf.adjust.describe(clf.labels.names)}")
    if req.gold_field:
        evaluation(clf, rows, result.results, req.gold_field, req.json_path, req.plot_path, say)
    if result.verify is None:
        return 0
    v = result.verify
    say(
        f"verify: {v['agreement']:.2%} label agreement with the gold loop over {v['items']} "
        f"items, max |score diff| {v['max_abs_score_diff']:.2e}"
    )
    for d in v["disagreements"][:20]:
        say(f"  disagreement: {json.dumps(d)}")
    return 0 if v["passed"] else 1


def evaluation(clf, rows, results, gold_field, json_path, plot_path, say) -> dict:
    """Print (and write) the evaluation of a job's rows against their gold labels."""
    from ..api.evaluate import evaluate_rows, format_evaluation, plot_confusion
    from ..io.outputs import write_json_report

    gold = [row.fields.get(gold_field) for row in rows]
    metrics = evaluate_rows(results, gold, clf.labels.names)
    note = " (SYNTHETIC weights: chance level is expected)" if clf.lm.synthetic else ""
    say(format_evaluation(metrics) + ("\n" + note.strip() if note else ""))
    if json_path:  # first: a plot that fails to draw does not lose the report
        write_json_report(json_path, metrics)
    if plot_path:
        plot_confusion(metrics, plot_path)
    return metrics
