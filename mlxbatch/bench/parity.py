"""Logit parity of mlxbatch against PyTorch `transformers` (fp32) and mlx-lm, any family.

mlx-lm reads only the older config spelling and always rotates LongRoPE with the long factors,
so it gets a rewritten config and the short factors as its long ones; its report says so."""

from __future__ import annotations

import gc
import json
import os
import tempfile
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import numpy as np

from ..engine.layout import batch_mask
from ..errors import one_line
from ..model.families import FAMILIES
from ..model.files import check_regular_files
from ..model.load import LoadedModel, load_model

PARITY_TEXTS = (
    "My invoice shows a double charge for November.",
    "The app crashes with error 0x80070005 every time I open settings.",
    "Hi,\n\nplease delete my account and all data.\nThanks",
    "ok",
    "Ünïcödé tëxt — with emoji 🚀 and <|im_end|> typed by a user.",
)
# fp32 on both sides; differences come from summation order only.
ATOL = 1e-4


@dataclass
class ParityReport:
    reference: str
    max_abs: float
    max_rel: float
    argmax_agree: float
    positions: int

    @property
    def passed(self) -> bool:
        return self.max_abs <= ATOL * max(1.0, self.scale) and self.argmax_agree == 1.0

    scale: float = 1.0  # largest |logit|, for the relative tolerance on large models

    def line(self) -> str:
        verdict = "PASS" if self.passed else "FAIL"
        return (
            f"{self.reference:<22} max|diff| {self.max_abs:.3e}  max rel {self.max_rel:.3e}  "
            f"argmax agree {self.argmax_agree:.1%} over {self.positions} positions  "
            f"[{verdict}: tol {ATOL:g} x max(1, max|logit|={self.scale:.2f})]"
        )


@dataclass(frozen=True)
class NotCompared:
    """A reference that could not run the checkpoint (its own limit, not a parity failure)."""

    reference: str
    why: str
    passed = False


def parity_batches(lm: LoadedModel) -> list[list[list[int]]]:
    """A single prompt, then padded batches mixing short and long prompts."""
    sys_prompt = "Classify the ticket."
    prompts = [lm.tokenizer.prompt(sys_prompt, t) for t in PARITY_TEXTS]
    return [[prompts[0]], prompts[:3], prompts[2:], prompts]


def mlx_logits(lm: LoadedModel, batch: list[list[int]]) -> list[np.ndarray]:
    """Full logits (L_i, V) per prompt from one right-padded batched forward."""
    lengths = np.array([len(p) for p in batch])
    width = int(lengths.max())
    tokens = np.zeros((len(batch), width), np.int32)
    for i, p in enumerate(batch):
        tokens[i, : len(p)] = p
    mask = mx.array(batch_mask(0, np.zeros_like(lengths), lengths, width, 0, width))
    h = lm.model(mx.array(tokens), None, 0, mask)
    logits = np.array(lm.model.head(h).astype(mx.float32))
    return [logits[i, :n] for i, n in enumerate(lengths)]


def hf_logits(model, batch: list[list[int]]) -> list[np.ndarray]:
    """The same through a `transformers` model, right-padded with an attention mask."""
    import torch

    lengths = [len(p) for p in batch]
    width = max(lengths)
    ids = torch.zeros((len(batch), width), dtype=torch.long)
    att = torch.zeros((len(batch), width), dtype=torch.long)
    for i, p in enumerate(batch):
        ids[i, : len(p)] = torch.tensor(p)
        att[i, : len(p)] = 1
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=att).logits.float().numpy()
    return [logits[i, :n] for i, n in enumerate(lengths)]


def mlx_lm_logits(model, batch: list[list[int]]) -> list[np.ndarray]:
    return [np.array(model(mx.array([p]))[0].astype(mx.float32)) for p in batch]


def compare(name: str, ours: list[np.ndarray], ref: list[np.ndarray]) -> ParityReport:
    a, b = np.concatenate(ours), np.concatenate(ref)
    diff = np.abs(a - b)
    return ParityReport(
        reference=name,
        max_abs=float(diff.max()),
        max_rel=float((diff / np.maximum(np.abs(b), 1e-3)).max()),
        argmax_agree=float((a.argmax(-1) == b.argmax(-1)).mean()),
        positions=a.shape[0],
        scale=float(np.abs(b).max()),
    )


def mlx_lm_config(cfg: dict) -> tuple[dict, str]:
    """`cfg` in the spelling mlx-lm reads, and a note on what else was changed ("" if nothing)."""
    cfg, note = dict(cfg), ""
    params = cfg.pop("rope_parameters", None) or {}
    if "full_attention" in params or "sliding_attention" in params:  # per layer type
        local, params = params.get("sliding_attention") or {}, params.get("full_attention") or {}
        if "rope_theta" in local:
            cfg.setdefault("rope_local_base_freq", local["rope_theta"])
    if "rope_theta" in params:
        cfg.setdefault("rope_theta", params["rope_theta"])
    scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind != "default":
        cfg.setdefault("rope_scaling", scaling | {"type": kind, "rope_type": kind})
    sliding = _sliding(cfg)
    types = cfg.get("layer_types")
    if sliding == "pattern" and types and "full_attention" in types:
        period = types.index("full_attention") + 1
        if all((t == "full_attention") == ((i + 1) % period == 0) for i, t in enumerate(types)):
            cfg["sliding_window_pattern"] = period
    rs = cfg.get("rope_scaling") or {}
    if rs.get("long_factor") is not None and rs.get("long_factor") != rs.get("short_factor"):
        cfg["rope_scaling"] = dict(rs, long_factor=rs["short_factor"])
        note = " (short factors)"
    window, context = cfg.get("sliding_window"), cfg.get("max_position_embeddings")
    if sliding == "all" and window and window < (context or 0):
        note += " (no sliding window)"  # mlx-lm's Phi-3 and Mistral attend to every key
    return cfg, note


def _sliding(cfg: dict) -> str:
    """Which layers the config's family lets slide (`Family.sliding`); "never" for others."""
    family = FAMILIES.get(cfg.get("model_type")) if isinstance(cfg.get("model_type"), str) else None
    return family.sliding if family else "never"


def _mlx_lm_logits(mlx_dir: Path, batches) -> tuple[str, list[np.ndarray]]:
    """mlx-lm's name in the report (with what its model leaves out) and its logits."""
    from mlx_lm.utils import load_model as mlx_lm_load

    cfg, note = mlx_lm_config(json.loads((mlx_dir / "config.json").read_text()))
    with tempfile.TemporaryDirectory() as tmp:
        for f in mlx_dir.iterdir():
            if f.name != "config.json":
                os.symlink(f.resolve(), Path(tmp) / f.name)
        (Path(tmp) / "config.json").write_text(json.dumps(cfg))
        peer, _ = mlx_lm_load(Path(tmp))
        return "mlx-lm" + note, [x for b in batches for x in mlx_lm_logits(peer, b)]


def run_parity(
    hf_dir: str | Path, mlx_dir: str | Path, with_mlx_lm: bool = True
) -> list[ParityReport | NotCompared]:
    """`mlx_dir`'s logits against transformers' of `hf_dir` (a directory or GGUF) and mlx-lm's."""
    import mlx.core as mx
    import torch
    from transformers import AutoModelForCausalLM

    if not Path(hf_dir).is_file():  # a GGUF was checked when it was converted
        check_regular_files(Path(hf_dir))  # transformers would block on a FIFO there
    lm = load_model(mlx_dir, dtype="float32")
    batches = parity_batches(lm)
    ours = [x for b in batches for x in mlx_logits(lm, b)]
    del lm  # one float32 model in memory at a time: Phi-4-mini's is 15 GB
    gc.collect()
    mx.clear_cache()

    def transformers() -> tuple[str, list[np.ndarray]]:
        path = Path(hf_dir)
        if path.is_file():  # a GGUF, read by transformers' own GGUF loading
            hf = AutoModelForCausalLM.from_pretrained(
                path.parent, gguf_file=path.name, dtype=torch.float32
            ).eval()
            name = "transformers (GGUF)"
        else:
            hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
            name = "transformers"
        return name, [x for b in batches for x in hf_logits(hf, b)]

    reports = [_reference("transformers", transformers, ours)]
    gc.collect()
    if with_mlx_lm:
        reports.append(_reference("mlx-lm", lambda: _mlx_lm_logits(Path(mlx_dir), batches), ours))
    return reports


def _reference(
    name: str, logits: Callable[[], tuple[str, list[np.ndarray]]], ours: list[np.ndarray]
) -> ParityReport | NotCompared:
    """A reference's logits compared with ours, or why it could not run the checkpoint."""
    try:
        shown, ref = logits()
    except Exception as e:
        where = traceback.extract_tb(e.__traceback__)[-1]
        return NotCompared(
            name,
            f"{type(e).__name__}: {one_line(e, 300)} (in "
            f"{Path(where.filename).name}:{where.lineno})",
        )
    return compare(shown, ours, ref)
