"""What a job reports: its summary (`JobResult`) and the figures summed by window (`Totals`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..api.classifier import Classifier
from ..engine.planner import DEFAULT_MAX_BATCH
from .plan import JobPlan


@dataclass
class JobResult:
    rows: int
    scored: int
    errors: int
    seconds: float
    padding_overhead: float
    batch_tokens: int
    peak_memory: int
    memory_bound: int
    verify: dict | None = field(default=None)
    planner: str = ""
    predicted_seconds: float | None = None
    results: list[dict] = field(default_factory=list, repr=False)  # output rows, input order
    abstained: int = 0
    ranks: list[dict] = field(default_factory=list)  # per rank: host, items, padded, seconds
    duplicates: int = 0  # rows that copied the result of an identical prompt in their window
    windows: int = 1
    resumed: int = 0  # rows the journal already held
    # rows this run scored, and the duplicates among them (None: all of `scored`, `duplicates`)
    computed: int | None = None
    computed_duplicates: int = 0

    def _this_run(self) -> tuple[int, int]:
        """(rows, duplicates) this run scored: rows a resume reads back cost it no time."""
        if self.computed is None:
            return self.scored, self.duplicates
        return self.computed, self.computed_duplicates

    @property
    def rate(self) -> float:
        """Items scored a second by this run (duplicates included: each is a row answered)."""
        return self._this_run()[0] / self.seconds if self.seconds else 0.0

    def summary(self) -> str:
        rate = self.rate
        return (
            f"{self.rows} rows ({self.scored} scored, {self.errors} errors) in "
            f"{self.seconds:.1f} s, {rate:.2f} items/s, padding overhead "
            f"{self.padding_overhead:.2%}, batch tokens {self.batch_tokens}, peak memory "
            f"{self.peak_memory / 2**30:.2f} GiB (bound {self.memory_bound / 2**30:.2f} GiB)"
            + (f"; planner {self.planner}" if self.planner else "")
            + (f", predicted {self.predicted_seconds:.1f} s" if self.predicted_seconds else "")
            + (f"; {self.abstained} abstained" if self.abstained else "")
            + (
                f"; {self.duplicates} duplicates scored once ({self._saved()})"
                if self.duplicates
                else ""
            )
            + (
                f"; resumed: {self.resumed} rows from the journal, batch shape as it recorded "
                f"(batch tokens {self.batch_tokens})"
                if self.resumed
                else ""
            )
            + "".join(self._rank_lines())
        )

    def _saved(self) -> str:
        """The duplicates' share of the rows, and the time they would have taken at the pace
        of the items this run scored (after a resume, of the duplicates this run met)."""
        rows, duplicates = self._this_run()
        distinct = rows - duplicates
        share = f"{self.duplicates / self.rows:.1%} of the rows"
        # under one full batch, the pace is mostly a batch's fixed cost: price as many again only
        if distinct < DEFAULT_MAX_BATCH and duplicates > distinct:
            return share
        saved = self.seconds * duplicates / distinct if distinct else 0.0
        return f"{share}, ~{saved:.1f} s saved at this job's pace"

    def _rank_lines(self):
        if not self.ranks:
            return
        total = sum(r["padded_tokens"] for r in self.ranks) or 1
        slowest = (
            min(r["items"] / r["seconds"] for r in self.ranks if r["seconds"])
            if any(r["seconds"] for r in self.ranks)
            else 0.0
        )
        for r in self.ranks:
            rate = r["items"] / r["seconds"] if r["seconds"] else 0.0
            yield (
                f"\n  rank {r['rank']} ({r['host']}): {r['items']} items, {rate:.2f} items/s "
                f"while computing, {r['padded_tokens'] / total:.0%} of the padded tokens"
            )
        if slowest:  # the ranks count the items they computed: duplicates are no rank's
            rows, duplicates = self._this_run()
            overall = (rows - duplicates) / self.seconds if self.seconds else 0.0
            yield (
                f"\n  {len(self.ranks)} ranks: {overall:.2f} items/s overall, "
                f"{overall / slowest:.2f}x the slowest rank alone"
            )


@dataclass
class Totals:
    """A job's figures, summed window by window."""

    scored: int = 0
    errors: int = 0
    useful: int = 0
    padded: int = 0
    memory_bound: int = 0
    predicted: float | None = None
    abstained: int = 0
    duplicates: int = 0
    windows: int = 0
    computed: int = 0  # rows whose batches this run scored
    computed_duplicates: int = 0  # of them, the copies of another row's result
    results: dict[int, dict] = field(default_factory=dict)  # kept only when asked for

    def add(
        self,
        clf: Classifier,
        plan: JobPlan,
        errors: list[tuple[int, dict]],
        written: list[tuple[int, dict]],
        keep: bool,
    ):
        """One window: its error rows, and the rows its batches wrote in this run."""
        rows = errors + written
        copies = {j for c in plan.copies.values() for j in c}
        self.windows += 1
        self.computed += len(written)
        self.computed_duplicates += sum(1 for i, _ in written if i in copies)
        self.scored += len(plan.items) + plan.duplicates
        self.errors += sum(1 for _, r in rows if "error" in r)
        self.useful, self.padded = (
            self.useful + plan.useful_tokens,
            self.padded + plan.padded_tokens,
        )
        self.memory_bound = max(self.memory_bound, plan.memory_bound)
        predicted = plan.predicted_seconds(clf.engine.cost_terms())
        if predicted is not None:
            self.predicted = (self.predicted or 0.0) + predicted
        self.abstained += sum(1 for _, r in rows if r.get("abstained"))
        self.duplicates += plan.duplicates
        if keep:
            self.results.update(rows)
