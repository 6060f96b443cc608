"""What the model is asked: the default labels, the default system prompt (naming the labels,
described when given) and the built-in few-shot examples."""

from __future__ import annotations

from ..errors import unicode_problem

DEFAULT_LABELS = ("billing", "technical", "account")

# Descriptions and three short examples per default label: the built-in few-shot prompt.
DEFAULT_DESCRIPTIONS = {
    "billing": "charges, invoices, refunds, payment methods, subscription prices and plans",
    "technical": "crashes, errors, bugs, sync or performance problems, devices and integrations",
    "account": "logins, passwords, two-factor codes, profile details, access and account deletion",
}
FEW_SHOT_EXAMPLES = (
    ("I was charged twice for my subscription this month.", "billing"),
    ("The app crashes every time I open the settings page.", "technical"),
    ("I can't log in, the reset password email never arrives.", "account"),
    ("Can I get a refund for the annual plan I bought yesterday?", "billing"),
    ("Sync between my phone and laptop stopped working after the update.", "technical"),
    ("Please delete my account and all of my data.", "account"),
    ("My invoice shows the wrong VAT number, please correct it.", "billing"),
    ("Exports fail with error 500 when the file is larger than 10 MB.", "technical"),
    ("How do I change the email address on my profile?", "account"),
)


def description_problem(line) -> str | None:
    """Why `line` cannot describe a label in the default prompt, or None."""
    if line is not None and not isinstance(line, str):
        return f"is not a string ({type(line).__name__})"
    if line and "\n" in line.strip():
        return "spans several lines (the prompt lists one line a label)"
    if line and (problem := unicode_problem(line)):
        return f"holds {problem}"
    return None


def default_system_prompt(
    labels: tuple[str, ...] | list[str], descriptions: dict[str, str] | None = None
) -> str:
    names = ", ".join(labels)
    if not descriptions:
        return (
            "You are a support-ticket triage assistant. Classify the customer's message into "
            f"exactly one of these categories: {names}. Answer with the category name only."
        )
    lines = "\n".join(
        f"- {x}: {descriptions[x].strip()}" if (descriptions.get(x) or "").strip() else f"- {x}"
        for x in labels  # stripped as --labels-file strips them: one description, one prompt
    )
    return (
        "You are a support-ticket triage assistant. Classify the customer's message into "
        f"exactly one of these categories:\n{lines}\nAnswer with the category name only."
    )


def few_shot_prompt(labels: tuple[str, ...]) -> tuple[str, tuple[tuple[str, str], ...]]:
    """The built-in few-shot prompt (default labels only): descriptions + 3 examples a label."""
    return built_in_prompt("few-shot", labels)


BUILT_IN_PROMPTS = ("descriptions", "few-shot")


def built_in_prompt(name: str, labels: tuple[str, ...]) -> tuple[str, tuple[tuple[str, str], ...]]:
    """(system prompt, examples) of the built-in "descriptions" or "few-shot" prompt."""
    if name not in BUILT_IN_PROMPTS:
        raise ValueError(f"no built-in prompt {name!r} (choose from {', '.join(BUILT_IN_PROMPTS)})")
    if tuple(labels) != DEFAULT_LABELS:
        raise ValueError("the built-in prompts are written for the default labels")
    shots = FEW_SHOT_EXAMPLES if name == "few-shot" else ()
    return default_system_prompt(labels, DEFAULT_DESCRIPTIONS), shots
