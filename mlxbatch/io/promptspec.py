"""The prompt a run uses, from its command-line options and the files they name: labels,
system prompt, few-shot examples or a questions file, as one `PromptSpec`."""

from __future__ import annotations

from pathlib import Path

from ..engine.promptspec import PromptSpec
from ..errors import LabelError, UsageError, unicode_problem
from .caps import PROMPT_FILE_BYTES, read_capped
from .questions import check_question_options, read_question_examples, read_questions

__all__ = ["PromptSpec", "parse_labels", "prompt_spec", "system_prompt_from"]


def parse_labels(labels: str | None) -> tuple[str, ...]:
    from ..engine.prompt import DEFAULT_LABELS

    if labels is None:
        return DEFAULT_LABELS
    return tuple(x.strip() for x in labels.split(","))


def system_prompt_from(text: str | None, file: Path | None) -> str | None:
    """The system prompt given as text or in a file; None when neither is (the default)."""
    if text is not None and file is not None:
        raise UsageError("give --system-prompt or --system-prompt-file, not both")
    if file is not None:
        try:
            data = read_capped(file, PROMPT_FILE_BYTES, "--system-prompt-file")
            # as a text editor shows it: no BOM, Windows line ends as \n (a file saved on
            # Windows scored other than the same prompt typed: "...\r" is another prompt)
            text = data.decode("utf-8-sig").replace("\r\n", "\n")
            return text.strip("\n")
        except (OSError, UnicodeDecodeError) as e:
            raise UsageError(f"{file}: cannot read the system prompt ({e})") from None
    if text is not None and (problem := unicode_problem(text)):
        raise UsageError(f"--system-prompt holds {problem}")
    return text


def prompt_spec(
    labels,
    labels_file,
    system_prompt,
    system_prompt_file,
    examples,
    text_field="text",
    questions=None,
    **settings,
) -> PromptSpec:
    """The run's prompt from the command-line options, read and checked once: labels, system
    prompt and examples; or a questions file (`questions`, a path), which gives the labels and
    may give the system prompt. `settings`: the rest of `PromptSpec` as given (calibrate,
    prior, min_confidence, tag_threshold)."""
    from .prompts import read_examples, read_labels_file

    if questions is not None:
        asked = read_questions(questions)
        check_question_options(asked, labels, labels_file, text_field)
        if examples:
            asked = asked.with_examples(read_question_examples(examples, asked, text_field))
        system = system_prompt_from(system_prompt, system_prompt_file)
        if system is not None and asked.system is not None:
            raise UsageError(
                f"{questions}: its `system` and --system-prompt both give the "
                "system prompt; give one of them"
            )
        system = system if system is not None else asked.system
        return PromptSpec(system_prompt=system, questions=asked, **settings)

    descriptions = read_labels_file(labels_file) if labels_file else None
    names = parse_labels(labels) if labels or not descriptions else tuple(descriptions)
    if descriptions and set(descriptions) != set(names):
        raise LabelError(
            f"{labels_file}: its labels {sorted(descriptions)} differ from --labels {sorted(names)}"
        )
    system = system_prompt_from(system_prompt, system_prompt_file)
    shots = read_examples(str(examples), names, text_field) if examples else ()
    return PromptSpec(names, system, shots, descriptions, **settings)
