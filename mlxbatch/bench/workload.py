"""A deterministic generator of synthetic support tickets with a ground-truth intent, their
lengths log-normal with a long tail (a mix sets median and tail)."""

from __future__ import annotations

import json
import math
import random
import sys
from pathlib import Path

from ..errors import OutputError
from ..io.outputs import check_output
from ..io.rows import output_format_of, write_records
from ..io.streams import write_whole

INTENTS = ("billing", "technical", "account")

# mix: (median body sentences, log-normal sigma, chance of a log, chance of a long story)
MIXES = {
    "default": (6.8, 0.5, 0.08, 0.05),
    "short": (2.0, 0.4, 0.02, 0.0),
    "long": (9.0, 0.5, 0.15, 0.15),
    "heavy-tail": (4.0, 0.9, 0.12, 0.12),
}
MAX_SENTENCES = 22

GREETINGS = [
    "Hi,",
    "Hello,",
    "Hello team,",
    "Hey there,",
    "Good morning,",
    "Dear support,",
    "Hi all,",
    "Bonjour,",
    "Hallo,",
    "To whom it may concern,",
    "",
]
SIGNOFFS = [
    "Thanks,",
    "Thank you!",
    "Best regards,",
    "Cheers,",
    "Regards,",
    "Merci,",
    "Thanks in advance.",
    "Vielen Dank,",
    "",
]
NAMES = [
    "Ana",
    "Björn",
    "Chen Wei",
    "Dmitri",
    "Elif",
    "François",
    "Grace",
    "Hiro",
    "Inês",
    "José",
    "Kwame",
    "Leila",
    "Marta",
    "Nguyễn",
    "Olu",
    "Priya",
    "Søren",
    "Zoë",
]
PRODUCTS = [
    "the Pro plan",
    "the Team plan",
    "the mobile app",
    "the desktop app",
    "the API",
    "the browser extension",
    "the starter plan",
    "the enterprise tier",
]
MONTHS = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
]

SENTENCES = {
    "billing": [
        "I was charged twice for {product} this month.",
        "My invoice for {month} shows {amount} but I expected {amount2}.",
        "Can you refund the last payment? It went through after I cancelled.",
        "My credit card ending in {digits} was declined even though it is valid.",
        "Why did the price of {product} go up without notice?",
        "I need a VAT invoice with our company address for {month}.",
        "The renewal charge of {amount} hit my account before the trial ended.",
        "Please switch me from monthly to annual billing and prorate the difference.",
        "There is a charge of {amount} I do not recognise on my statement.",
        "The coupon code did not apply at checkout and I paid full price.",
    ],
    "technical": [
        "{product} crashes as soon as I open the settings page.",
        "Sync has been stuck at {percent}% since yesterday.",
        "I get error {code} when uploading files larger than {size} MB.",
        "After the latest update {product} is extremely slow to start.",
        "The export to CSV produces an empty file.",
        "Notifications stopped working on my phone after updating to version {version}.",
        "The page shows a blank screen in Firefox but works in Chrome.",
        "Our webhook calls time out after {seconds} seconds.",
        "Search returns no results even for items I can see in the list.",
        "The dark mode toggle resets every time I restart {product}.",
    ],
    "account": [
        "I cannot log in to my account; the password reset email never arrives.",
        "Please change the email address on my account to {email}.",
        "How do I delete my account and all my data?",
        "My account was locked after too many login attempts.",
        "I want to add a second admin to our team account.",
        "Two-factor authentication codes from my phone are rejected.",
        "Please merge my two accounts, one uses {email}.",
        "I changed phones and lost access to my authenticator app.",
        "Someone else seems to have logged in to my account from another country.",
        "How can I transfer ownership of the workspace to a colleague?",
    ],
}
FILLER = [
    "This is quite urgent for us.",
    "I have already tried restarting.",
    "I have been a customer for {years} years.",
    "Our team depends on this every day.",
    "I looked through the help center but found nothing.",
    "Please get back to me soon.",
    "Let me know if you need more details.",
    "This happened before, in {month}, too.",
    "Ça devient vraiment pénible.",
    "Das ist wirklich ärgerlich.",
    "有点着急，谢谢。",
]
STORY = [
    "Let me explain the whole situation from the beginning, because it is complicated.",
    "Back in {month} our finance team moved to a new system and we reorganised everything.",
    "At first everything looked fine, but then my colleague {name} noticed something odd.",
    "We spent most of the afternoon going through old emails and screenshots.",
    "I called your phone line twice but was disconnected both times after waiting.",
    "In the meantime our manager asked for a written summary of what went wrong.",
    "I really like the product otherwise, which is why I am writing in so much detail.",
    "We also tried it on a second laptop and on the office network, with the same result.",
]


def _fill(s: str, r: random.Random) -> str:
    s = s.format(
        product=r.choice(PRODUCTS),
        month=r.choice(MONTHS),
        name=r.choice(NAMES),
        amount=f"${r.randint(5, 999)}.{r.randint(0, 99):02d}",
        amount2=f"€{r.randint(5, 999)},{r.randint(0, 99):02d}",
        digits=f"{r.randint(0, 9999):04d}",
        percent=r.randint(1, 99),
        code=f"0x{r.randint(0, 2**32 - 1):08X}",
        size=r.choice([10, 50, 100, 250]),
        version=f"{r.randint(1, 9)}.{r.randint(0, 20)}.{r.randint(0, 9)}",
        seconds=r.choice([5, 10, 30, 60]),
        email=f"{r.choice(NAMES).split()[0].lower()}{r.randint(1, 99)}@example.com",
        years=r.randint(2, 12),
    )
    return s[0].upper() + s[1:]


def _error_log(r: random.Random) -> str:
    lines = ["Here is the log:", "```"]
    for _ in range(r.randint(2, 6)):
        ts = f"2026-{r.randint(1, 12):02d}-{r.randint(1, 28):02d}T{r.randint(0, 23):02d}:{r.randint(0, 59):02d}:{r.randint(0, 59):02d}Z"
        lines.append(
            f"{ts} ERROR [{r.choice(['sync', 'auth', 'http', 'db'])}] "
            f"code={r.randint(100, 599)} request_id={r.getrandbits(64):016x}"
        )
    lines.append("```")
    return "\n".join(lines)


def _ticket(r: random.Random, intent: str, mix: tuple[float, float, float, float]) -> str:
    median, sigma, p_log, p_story = mix
    n = min(MAX_SENTENCES, max(1, round(math.exp(math.log(median) + sigma * r.gauss(0, 1)))))
    body = [_fill(r.choice(SENTENCES[intent]), r)]
    for _ in range(n - 1):
        pool = SENTENCES[intent] if r.random() < 0.6 else FILLER
        body.append(_fill(r.choice(pool), r))
    if r.random() < p_story:
        body[1:1] = [_fill(s, r) for s in r.sample(STORY, r.randint(3, len(STORY)))]
    parts = [r.choice(GREETINGS), " ".join(body)]
    if intent == "technical" and r.random() < p_log * 3:
        parts.append(_error_log(r))
    signoff = r.choice(SIGNOFFS)
    if signoff:
        parts.append(f"{signoff}\n{r.choice(NAMES)}")
    return "\n".join(p for p in parts if p)


def generate(n: int, seed: int = 0, mix: str = "default") -> list[dict]:
    """`n` tickets: {"id": "t00001", "text": ..., "intent": ...}; the same for the same args."""
    if mix not in MIXES:
        raise ValueError(f"unknown mix {mix!r}; choose from {', '.join(MIXES)}")
    r = random.Random(f"mlxbatch-tickets/{seed}/{mix}")
    out = []
    for i in range(n):
        intent = INTENTS[r.randrange(len(INTENTS))]
        out.append(
            {"id": f"t{i + 1:05d}", "text": _ticket(r, intent, MIXES[mix]), "intent": intent}
        )
    return out


def jsonl_text(rows: list[dict]) -> str:
    """What `write_jsonl` writes for `rows` (as UTF-8)."""
    return "".join(json.dumps(x, ensure_ascii=False) + "\n" for x in rows)


def write_jsonl(rows: list[dict], path: Path | None) -> None:
    text = jsonl_text(rows)
    if path is None:
        sys.stdout.write(text)
    else:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
        except OSError as e:
            raise OutputError(f"{path}: cannot write the tickets ({e.strerror or e})") from None


def write_tickets(rows: list[dict], path: Path | None) -> None:
    """Tickets to `path` in the format its name says (written whole), or as JSONL to stdout."""
    if path is None:
        sys.stdout.write("".join(json.dumps(x, ensure_ascii=False) + "\n" for x in rows))
        return
    fmt = output_format_of(path)
    check_output(path, [], resume=False)  # as classify's -o: no journal, no file a run holds
    if fmt != ("jsonl", False) and path.exists() and not path.is_file():
        raise OutputError(
            f"{path}: cannot write the tickets as {''.join(path.suffixes[-2:])} "
            "there (not a regular file); drop the suffix for JSONL"
        )
    write_whole(path, lambda f: write_records(f, rows, path.name), "cannot write the tickets")
