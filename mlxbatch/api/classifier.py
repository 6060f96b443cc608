"""The Python API: load once, classify lists of texts.

from mlxbatch import Classifier
clf = Classifier.load("weights/qwen2.5-0.5b", labels=["billing", "technical", "account"])
for p in clf.classify(["I was charged twice", "The app crashes"]):
    print(p.label, p.scores)
"""

from __future__ import annotations

import os
import threading
import warnings
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from ..engine.adjust import Adjustment
from ..engine.calibration import cost_model
from ..engine.engine import Engine
from ..engine.item import Item
from ..engine.labels import LabelSet
from ..engine.planner import DEFAULT_MAX_BATCH, Batch, CostModel, unsort
from ..engine.prompt import DEFAULT_LABELS, default_system_prompt
from ..engine.promptspec import PromptSpec
from ..engine.scheduler import BatchPolicy, Scheduler, positional_items
from ..errors import ItemTooLong, ModelError, SyntheticWeights, UsageError
from ..model.hub import resolve
from ..model.label_tokens import label_tokens
from ..model.load import LoadedModel, load_model
from ..model.tokenizer import Examples
from .arguments import check_flag, check_model_dir, checked_texts
from .limits import LIMIT_SETTINGS, Limit, prepare, prepare_distinct
from .spec import RunSpec, Settings, item_limit, resolve_settings

# `Classifier.load`'s prompt keywords as they default: one differing was given
LOAD_DEFAULTS = {
    "labels": DEFAULT_LABELS,
    "system_prompt": None,
    "examples": (),
    "calibrate": False,
    "prior": None,
    "min_confidence": None,
    "descriptions": None,
    "questions": None,
    "tag_threshold": None,  # with questions: 0.5 (engine/promptspec.py)
}


@dataclass(frozen=True)
class Prediction:
    label: str | None  # None: abstained (below min_confidence), or scores not finite
    scores: dict[str, float]
    abstained: bool = False
    truncated: dict | None = None  # {"from_tokens", "to_tokens"} where `truncate` cut the text
    # with questions: {question: {"label", "scores"} or {"labels", "scores"} (multi-label)}
    answers: dict | None = None

    @property
    def not_finite(self) -> bool:
        """No answer, and no abstention: the scores are not finite (`Classifier.predictions`)."""
        if self.answers is not None:
            return not np.isfinite(list(self.scores.values())).all()
        return self.label is None and not self.abstained


def prompt_of(prompt: PromptSpec | None, **keywords) -> PromptSpec:
    """`Classifier.load`'s prompt: `prompt`, or the spec its prompt keywords build (a thin
    convenience); both at once is refused."""
    given = [k for k, v in keywords.items() if v is not LOAD_DEFAULTS[k]]
    if prompt is not None:
        if not isinstance(prompt, PromptSpec):
            raise UsageError(f"prompt: expected a PromptSpec, got {type(prompt).__name__}")
        if given:
            raise UsageError(f"prompt and {given[0]}: give the prompt's settings in one of them")
        return prompt
    k = keywords
    if k["questions"] is not None:
        from .questions import questions_of

        k["questions"] = questions_of(k["questions"])
        if k["examples"]:  # rows of a label (or tags) per question, into each question's turns
            from ..engine.question_examples import example_rows

            rows = example_rows(k["questions"], k["examples"])
            k["questions"], k["examples"] = k["questions"].with_examples(rows), ()
    if k["labels"] is DEFAULT_LABELS:
        k["labels"] = None  # the default labels, and none with questions
    return PromptSpec(**k)


class Classifier:
    def __init__(
        self,
        lm: LoadedModel,
        labels: LabelSet,
        system_prompt: str,
        prefix_cache: bool,
        examples: Examples = (),
        adjust: Adjustment | None = None,
        engine: Engine | None = None,
    ):
        self.lm, self.labels, self.system_prompt = lm, labels, system_prompt
        self.examples = tuple(examples)
        self.engine = engine or Engine(
            lm, labels, system_prompt, prefix_cache=prefix_cache, examples=self.examples
        )
        self.adjust = adjust or Adjustment()
        self.footprint = self.engine.footprint
        self._cost: CostModel | None = None  # the planner's cost model, looked up once
        self._limits: dict[tuple, Limit] = {}  # the item limit per (max_tokens, budget)
        self._limits_lock = threading.Lock()  # not behind a calibration (cost_model's lock)
        self._lock = threading.Lock()
        self.pid = os.getpid()  # MLX's state does not survive a fork (check_process)

    def check_process(self) -> None:
        """Refuse use in a forked child: MLX's allocator and threads are the parent's, and the
        first call into it there (`mx.set_cache_limit`) hangs for good instead of failing."""
        if os.getpid() != self.pid:
            raise UsageError(
                f"this Classifier was loaded in process {self.pid} and is used in "
                f"a forked child ({os.getpid()}), where MLX hangs: load one in the "
                "child, or start workers with multiprocessing's 'spawn'"
            )

    @classmethod
    def load(
        cls,
        model_dir: str | Path,
        labels: list[str] | tuple[str, ...] = DEFAULT_LABELS,
        system_prompt: str | None = None,
        dtype: str | None = None,
        prefix_cache: bool = True,
        check_finite: bool = False,
        examples: Examples = (),
        calibrate: bool = False,
        prior: dict[str, float] | str | None = None,
        min_confidence: float | None = None,
        descriptions: dict[str, str] | None = None,
        questions=None,
        tag_threshold: float | None = None,
        prompt: PromptSpec | None = None,
    ) -> Classifier:
        """Load a model (a directory or a hub id) for a label set. `examples`: few-shot (text, label) pairs; `calibrate`:
        contextual calibration; `prior`: {label: weight} or "a=0.5,b=0.5"; `min_confidence`:
        abstain below it; `descriptions`: {label: one line} for the default system prompt.
        `questions`: several questions asked of each text instead of one label set (a YAML or
        JSON questions file, a list of {name, ask, labels | multi_label}, or a mapping with
        `questions` and `system`); the predictions then carry `answers`, tags on at P(yes)
        >= `tag_threshold` (0.5 unless given); `examples` are then rows {"text": ...,
        question: label or tags}, and each question's `prior` is a key of its entry.
        `prompt`: all of these as one `PromptSpec` instead."""
        check_model_dir(model_dir)
        for name, value in (("prefix_cache", prefix_cache), ("check_finite", check_finite)):
            check_flag(name, value)
        spec = prompt_of(
            prompt,
            labels=labels,
            system_prompt=system_prompt,
            examples=examples,
            calibrate=calibrate,
            prior=prior,
            min_confidence=min_confidence,
            descriptions=descriptions,
            questions=questions,
            tag_threshold=tag_threshold,
        )  # what needs no model is refused before it loads
        lm = load_model(resolve(model_dir), dtype=dtype, check_finite=check_finite)
        if spec.questions is not None:
            return cls._load_questions(lm, spec, prefix_cache)
        if lm.synthetic:  # a newcomer's first load is often the demo's random model
            warnings.warn(
                f"{lm.path}: SYNTHETIC random weights, not a real model: the labels "
                "are at chance level",
                SyntheticWeights,
                stacklevel=2,
            )
        labels = spec.labels
        system = spec.system_prompt
        if system is None:
            system = default_system_prompt(labels, spec.descriptions)
        tokens = label_tokens(labels, lm.tokenizer.label, lm.model.args.vocab_size)
        clf = cls(lm, LabelSet(labels, tokens), system, prefix_cache, spec.examples)
        p_cf = clf.engine.content_free() if spec.calibrate else None
        clf.adjust = Adjustment(p_cf, spec.weights, spec.min_confidence)
        return clf

    @classmethod
    def _load_questions(cls, lm: LoadedModel, spec: PromptSpec, prefix_cache: bool) -> Classifier:
        from .questions import QuestionsClassifier

        clf = QuestionsClassifier(lm, spec.questions, spec.system, prefix_cache, spec.tag_threshold)
        clf.adjusted(spec.calibrate, spec.min_confidence)
        return clf

    @property
    def columns(self) -> tuple[str, ...]:
        """The output's score columns: the labels."""
        return self.labels.names

    def settings(
        self,
        spec: RunSpec | None = None,
        recorded: dict | None = None,
        cost: CostModel | None = None,
    ) -> Settings:
        """This classifier's settings for a run under `spec` (see `spec.resolve_settings`; the
        cost planner's model is `cost`, else this classifier's, looked up only when needed)."""
        spec = spec or RunSpec()
        limit = self.item_limit(spec) if recorded is None else None
        return resolve_settings(self.engine, spec, recorded, cost or self.cost_model, limit)

    def item_limit(self, spec: RunSpec) -> Limit:
        """The most tokens an item may feed under `spec` (`spec.item_limit`), measured once per
        `max_tokens` and budget: free memory is part of it, and a text must be cut alike
        every time."""
        key = (spec.max_tokens, spec.batch_tokens)
        with self._limits_lock:
            if key not in self._limits:
                self._limits[key] = item_limit(self.engine, spec)
            return self._limits[key]

    def cost_model(self) -> CostModel:
        """The planner's cost model: this machine's cached calibration, else the defaults;
        looked up once per classifier (the calibration cache is a file)."""
        with self._lock:
            if self._cost is None:
                self._cost = cost_model(self.engine)
            return self._cost

    def policy(
        self,
        mode: str = "sorted",
        batch_tokens: int | None = None,
        max_batch: int = DEFAULT_MAX_BATCH,
        planner: str = "cost",
        cost: CostModel | None = None,
    ) -> BatchPolicy:
        """How this classifier's scheduler cuts and scores items in `mode`: its resolved
        settings' policy (`cost`: another cost model for the cost planner)."""
        return self.settings(RunSpec(mode, planner, batch_tokens, max_batch), cost=cost).policy

    def plan(
        self,
        prompts: list[list[int]],
        mode: str = "sorted",
        batch_tokens: int | None = None,
        max_batch: int = DEFAULT_MAX_BATCH,
        planner: str = "cost",
        cost: CostModel | None = None,
    ) -> list[Batch]:
        """Batches of `prompts` (indices are positions) for `mode`, as the scheduler cuts them
        (`cost`: another cost model for the cost planner)."""
        policy = self.policy(mode, batch_tokens, max_batch, planner, cost)
        return Scheduler(self.engine, policy, positional_items(self.engine, prompts)).plan()

    def prepare(self, text: str, max_tokens: int | None = None, truncate: bool = False) -> Item:
        """`text` as an item within the limit (the smaller of `max_tokens`, the model's context
        and what memory holds), cut to fit when `truncate`; else `ItemTooLong` naming the limit."""
        check_flag("truncate", truncate)
        try:  # as classify checks a text: its type, its unicode, not empty
            text = checked_texts([text])[0]
        except UsageError as e:
            raise UsageError(str(e).replace("texts[0]", "text", 1)) from None
        limit = self.item_limit(RunSpec(max_tokens=max_tokens))
        item = prepare(self.engine, text, limit, truncate)
        if isinstance(item, str):
            raise ItemTooLong(item, LIMIT_SETTINGS)
        return item

    def predictions(self, probs: np.ndarray) -> list[Prediction]:
        """The one way scores become answers, for every entry: raw (N, J) probabilities with
        calibration, prior and abstention applied."""
        shape, labels = np.shape(probs), len(self.labels.names)
        if len(shape) != 2 or shape[1] != labels:  # was a TypeError or an IndexError inside
            raise UsageError(
                f"probs: expected an (N, {labels}) array, one score per label, got shape {shape}"
            )
        return [self._prediction(p) for p in self.adjust.apply(probs)]

    def classify(
        self,
        texts: list[str],
        mode: str = "sorted",
        batch_tokens: int | None = None,
        max_batch: int = DEFAULT_MAX_BATCH,
        max_tokens: int | None = None,
        truncate: bool = False,
    ) -> list[Prediction]:
        """Label probabilities for each text, in input order (mode='sequential': the gold loop);
        safe from several threads at once. Texts over `max_tokens` are refused, or cut to fit
        with `truncate`."""
        self.check_process()
        check_flag("truncate", truncate)
        texts = checked_texts(texts)
        spec = RunSpec(
            mode, "cost", batch_tokens, max_batch, max_tokens, "truncate" if truncate else "error"
        )  # (validates)
        if not texts:
            return []
        settings = self.settings(spec)
        items, slot = prepare_distinct(self.engine, texts, settings.limit, settings.truncating)
        scheduler = Scheduler(self.engine, settings.policy, items)
        done = [(batch, list(probs)) for batch, probs, _ in scheduler.step()]
        answers = self.predictions(np.stack(unsort(done, len(items)))[slot])
        for i, said in enumerate(answers):
            if said.not_finite:  # as the file job's rows are refused
                raise ModelError(
                    f"texts[{i}]: {self.non_finite()}; load it with "
                    "dtype='float32', or check_finite=True to check its weights"
                )
        cut = [items[k].truncated for k in slot]  # as classify's rows and the service say
        return [replace(p, truncated=c) if c else p for p, c in zip(answers, cut)]

    def non_finite(self) -> str:
        """Why a row of scores that are not finite has no answer, before each entry's hint."""
        return f"the model gave non-finite scores (NaN/inf) in {str(self.lm.dtype).split('.')[-1]}"

    def _prediction(self, probs: np.ndarray) -> Prediction:
        names = self.labels.names
        scores = dict(zip(names, map(float, probs)))
        if not np.isfinite(probs).all():  # no answer: argmax read NaN as the first label
            return Prediction(None, scores)
        if self.adjust.abstains(probs):
            return Prediction(None, scores, True)
        return Prediction(names[int(np.argmax(probs))], scores)
