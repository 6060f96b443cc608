"""The Python API: load once, classify lists of texts.

from mlxbatch import Classifier
clf = Classifier.load("weights/qwen2.5-0.5b", labels=["billing", "technical", "account"])
for p in clf.classify(["I was charged twice", "The app crashes"]):
    print(p.label, p.scores)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..engine.adjust import Adjustment, parse_prior
from ..engine.calibration import cost_model
from ..engine.engine import MODES, Engine
from ..engine.footprint import preferred_budget
from ..engine.labels import LabelSet
from ..engine.planner import DEFAULT_MAX_BATCH, Batch, CostModel, plan
from ..engine.prompt import DEFAULT_LABELS, default_system_prompt
from ..errors import LabelError, UsageError, unicode_problem
from ..model.hub import resolve
from ..model.load import LoadedModel, load_model
from ..model.tokenizer import Examples


@dataclass(frozen=True)
class Prediction:
    label: str | None  # None when the classifier abstains (below min_confidence)
    scores: dict[str, float]
    abstained: bool = False


class Classifier:
    def __init__(
        self, lm: LoadedModel, labels: LabelSet, system_prompt: str, prefix_cache: bool,
        examples: Examples = (), adjust: Adjustment | None = None,
    ):  # fmt: skip
        self.lm, self.labels, self.system_prompt = lm, labels, system_prompt
        self.examples = tuple(examples)
        self.engine = Engine(lm, labels, system_prompt, prefix_cache=prefix_cache,
                             examples=self.examples)  # fmt: skip
        self.adjust = adjust or Adjustment()
        self.footprint = self.engine.footprint

    @classmethod
    def load(
        cls, model_dir: str | Path, labels: list[str] | tuple[str, ...] = DEFAULT_LABELS,
        system_prompt: str | None = None, dtype: str | None = None, prefix_cache: bool = True,
        check_finite: bool = False, examples: Examples = (), calibrate: bool = False,
        prior: dict[str, float] | str | None = None, min_confidence: float | None = None,
        descriptions: dict[str, str] | None = None,
    ) -> Classifier:  # fmt: skip
        """Load a model (a directory or a hub id) for a label set. `examples`: few-shot (text, label) pairs; `calibrate`:
        contextual calibration; `prior`: {label: weight} or "a=0.5,b=0.5"; `min_confidence`:
        abstain below it; `descriptions`: {label: one line} for the default system prompt."""
        lm = load_model(resolve(model_dir), dtype=dtype, check_finite=check_finite)
        labels = tuple(labels)
        label_set = LabelSet.build(labels, lm.tokenizer.label, lm.model.args.vocab_size)
        bad = [lab for _, lab in examples if lab not in labels]
        if bad:
            raise LabelError(f"example label(s) {sorted(set(bad))} are not in the label set")
        if system_prompt is None:
            system_prompt = default_system_prompt(labels, descriptions)
        if min_confidence is not None and not 0 <= min_confidence <= 1:
            raise LabelError(f"--min-confidence {min_confidence} is not between 0 and 1")
        if isinstance(prior, dict):
            prior = ",".join(f"{k}={v}" for k, v in prior.items())
        clf = cls(lm, label_set, system_prompt, prefix_cache, examples)
        clf.adjust = Adjustment(
            clf.engine.content_free() if calibrate else None,
            parse_prior(prior, labels) if prior else None, min_confidence,
        )  # fmt: skip
        return clf

    def fed_lengths(self, prompts: list[list[int]]) -> list[int]:
        """Tokens each item feeds through the model (its prompt minus the shared prefix)."""
        return self.engine.fed_lengths(prompts)

    def default_batch_tokens(self, max_batch: int, longest: int) -> int:
        """The budget cap of either planner: the device's preferred budget (a CPU core's or a
        whole GPU's), raised to fit the longest item, within memory. The cost planner cuts
        by predicted time below it; greedy fills it."""
        return self.footprint.default_budget(max_batch, longest, preferred=preferred_budget())

    def cost_model(self) -> CostModel:
        """The planner's cost model: this machine's cached calibration, else the defaults."""
        return cost_model(self.engine)

    def plan(
        self, prompts: list[list[int]], mode: str = "sorted", batch_tokens: int | None = None,
        max_batch: int = DEFAULT_MAX_BATCH, planner: str = "cost", cost: CostModel | None = None,
    ) -> list[Batch]:  # fmt: skip
        """Batches for `mode`; sorted mode uses `planner` ("cost": the least predicted time)."""
        lengths = self.fed_lengths(prompts)
        name = planner if mode == "sorted" else MODES[mode].planner
        if batch_tokens is None:
            batch_tokens = self.default_batch_tokens(max_batch, max(lengths, default=1))
        if name == "cost" and cost is None:
            cost = self.cost_model()
        return plan(lengths, name, batch_tokens, max_batch, cost, *self.cost_terms())

    def cost_terms(self) -> tuple[int, int, int]:
        """What the cost model counts besides each batch's rows and width: the shared prefix
        tokens, and the multi-token label pass (rows per item, tokens per row; none when every
        label is one token)."""
        labels = self.labels
        rows = len(labels.names) if labels.max_len > 1 else 0
        return len(self.engine.prefix), rows, labels.max_len - 1

    def classify(
        self, texts: list[str], mode: str = "sorted", batch_tokens: int | None = None,
        max_batch: int = DEFAULT_MAX_BATCH,
    ) -> list[Prediction]:  # fmt: skip
        """Label probabilities for each text, in input order. mode='sequential' is the gold loop."""
        texts = list(texts)
        for i, t in enumerate(texts):
            if not isinstance(t, str):
                raise UsageError(f"texts[{i}]: expected a str, got {type(t).__name__}")
            if problem := unicode_problem(t):
                raise UsageError(f"texts[{i}] holds {problem}")
        if not texts:
            return []
        prompts = [self.engine.prompt(t) for t in texts]
        batches = self.plan(prompts, mode, batch_tokens, max_batch)
        probs = self.adjust.apply(self.engine.score_all(prompts, batches, MODES[mode].scorer))
        return [self._prediction(p) for p in probs]

    def _prediction(self, probs: np.ndarray) -> Prediction:
        names = self.labels.names
        scores = dict(zip(names, map(float, probs)))
        if self.adjust.abstains(probs):
            return Prediction(None, scores, True)
        return Prediction(names[int(np.argmax(probs))], scores)
