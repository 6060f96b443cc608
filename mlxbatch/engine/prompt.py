"""What the model is asked: the label set's default names and the default system prompt."""

from __future__ import annotations

DEFAULT_LABELS = ("billing", "technical", "account")


def default_system_prompt(labels: tuple[str, ...] | list[str]) -> str:
    names = ", ".join(labels)
    return (
        "You are a support-ticket triage assistant. Classify the customer's message into "
        f"exactly one of these categories: {names}. Answer with the category name only."
    )
