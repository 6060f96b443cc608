"""A classifier that asks every text several questions (`Classifier.load(..., questions=...)`).

It is a `Classifier` whose engine scores a text's questions together (engine/question_engine.py);
`predictions` turns each row of the engine's columns into `answers`: per single-label
question its label and scores (calibration and abstention applied per question), per
multi-label question the tags whose P(yes) reaches the tag threshold and each tag's P(yes).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import yaml

from ..engine.adjust import Adjustment
from ..engine.calibration import cost_model
from ..engine.engine import Engine
from ..engine.labels import LabelSet
from ..engine.planner import CostModel
from ..engine.question_engine import QuestionsEngine
from ..engine.questions import DEFAULT_SYSTEM, AnswerColumns, Asked, Questions, questions_from
from ..errors import InputError, LabelError, UsageError
from ..model.label_tokens import label_tokens
from ..model.load import LoadedModel
from .classifier import Classifier, Prediction

TAG_THRESHOLD = 0.5


class QuestionsClassifier(Classifier):
    def __init__(
        self,
        lm: LoadedModel,
        questions: Questions,
        system_prompt: str | None,
        prefix_cache: bool = True,
        tag_threshold: float = TAG_THRESHOLD,
    ):
        self.questions, self.asked = questions, questions.asked()
        self.tag_threshold = tag_threshold
        system_prompt = system_prompt if system_prompt is not None else DEFAULT_SYSTEM
        sets = tuple(label_set(lm, a, questions.source) for a in self.asked)
        engine = QuestionsEngine(
            lm,
            [a.user_text("") for a in self.asked],
            sets,
            system_prompt,
            prefix_cache,
            shots=[a.examples for a in self.asked],
        )
        super().__init__(lm, engine.labels, system_prompt, prefix_cache, engine=engine)
        self.adjusts = tuple(Adjustment() for _ in self.asked)

    def adjusted(self, calibrate: bool, min_confidence: float | None) -> None:
        """Calibration per question (each prompt's own content-free scores), and the prior
        and abstention of each single-label question."""
        p_cf = self.engine.content_free() if calibrate else None
        self.adjusts = tuple(
            Adjustment(
                None if p_cf is None else p_cf[a:b],
                asked.prior,
                None if asked.tag is not None else min_confidence,
            )
            for asked, (a, b) in zip(self.asked, self.engine.spans())
        )
        self.adjust = Adjustment(min_confidence=min_confidence)  # what a journal's rows carry

    def cost_model(self) -> CostModel:
        """The planner's cost model of a single question's engine (the calibration scores
        plain prompts): a text's questions feed about as many tokens as its width says."""
        with self._lock:
            if self._cost is None:
                single = Engine(
                    self.lm, self.engine.label_sets[0], self.system_prompt, self.engine.prefix_cache
                )
                self._cost = cost_model(single)
            return self._cost

    @property
    def columns(self) -> tuple[str, ...]:
        """The output's score columns: `question_label`, or `question_tag`."""
        return AnswerColumns.of(self.questions)

    def predictions(self, probs: np.ndarray) -> list[Prediction]:
        shape, width = np.shape(probs), len(self.labels.names)
        if len(shape) != 2 or shape[1] != width:
            raise UsageError(
                f"probs: expected an (N, {width}) array, one score per column, got shape {shape}"
            )
        return [self._answers(row) for row in np.asarray(probs)]

    def _answers(self, row: np.ndarray) -> Prediction:
        answers: dict[str, dict] = {}
        flat: dict[str, float] = {}
        for asked, adjust, (a, b) in zip(self.asked, self.adjusts, self.engine.spans()):
            p = adjust.apply(row[None, a:b])[0]
            if asked.tag is not None:
                tags = answers.setdefault(asked.question, {"labels": [], "scores": {}})
                tags["scores"][asked.tag] = float(p[0])
                if p[0] >= self.tag_threshold:
                    tags["labels"].append(asked.tag)
                flat[f"{asked.question}_{asked.tag}"] = float(p[0])
                continue
            scores = dict(zip(asked.labels, map(float, p)))
            flat |= {f"{asked.question}_{k}": v for k, v in scores.items()}
            if not np.isfinite(p).all():
                answers[asked.question] = {"label": None, "scores": scores}
            elif adjust.abstains(p):
                answers[asked.question] = {"label": None, "abstained": True, "scores": scores}
            else:
                answers[asked.question] = {
                    "label": asked.labels[int(np.argmax(p))],
                    "scores": scores,
                }
        return Prediction(None, flat, answers=answers)

    def check_answers(self, prompt: list[int], served: dict) -> tuple[dict, dict, float]:
        """The gold loop's answers for `prompt` against `served` (an output row's answers):
        (gold answers, served answers, the largest score difference; nan if either is not
        finite)."""
        gold = self.predictions(self.engine.score_gold(prompt)[None])[0]
        want = np.array(list(gold.scores.values()), np.float64)
        got = np.array(
            [
                ((served.get(q) or {}).get("scores") or {}).get(x, np.nan)
                for q, x in self._column_keys()
            ],
            np.float64,
        )
        ok = np.isfinite(want).all() and np.isfinite(got).all()
        return gold.answers, served, float(np.abs(want - got).max()) if ok else float("nan")

    def _column_keys(self) -> list[tuple[str, str]]:
        return [(q.name, x) for q in self.questions.questions for x in q.columns()]


def label_set(lm: LoadedModel, asked: Asked, source: str) -> LabelSet:
    """An asked prompt's labels, tokenized; refused by file and question when they cannot be
    scored apart (only the model's tokenizer can tell)."""
    try:
        tokens = label_tokens(asked.labels, lm.tokenizer.label, lm.model.args.vocab_size)
    except LabelError as e:
        raise LabelError(f"{source}: question {asked.question!r}: field 'labels': {e}") from None
    return LabelSet(asked.labels, tokens)


def answer_words(answers: dict) -> str:
    """Answers in one line: `intent=billing; tags=refund+login`."""
    said = []
    for name, a in answers.items():
        if "labels" in a:
            said.append(f"{name}={'+'.join(a['labels']) or '-'}")
        else:
            label = a.get("label")
            said.append(f"{name}={label if not a.get('abstained') else 'abstains'}")
    return "; ".join(said)


def questions_of(value) -> Questions:
    """The Python API's `questions`: a `Questions`, a path to a YAML/JSON questions file, a
    list of questions, or a mapping with `questions` (and `system`)."""
    if isinstance(value, Questions):
        return value
    if not isinstance(value, (str, Path)):
        return questions_from(value, "questions")
    path = Path(value)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"{path}: cannot read the questions file ({e})") from None
    try:
        data = (
            yaml.safe_load(text) if path.suffix.lower() in (".yaml", ".yml") else json.loads(text)
        )
    except (yaml.YAMLError, ValueError) as e:
        first = (str(e).splitlines() or [type(e).__name__])[0][:120]
        raise InputError(f"{path}: not a valid questions file ({first})") from None
    return questions_from(data, str(path))
