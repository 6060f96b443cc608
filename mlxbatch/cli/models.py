"""Model commands: `convert`, `init-random`, `parity`."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ..model.presets import PRESETS
from .common import fail


@click.command()
@click.argument("hf_dir", type=click.Path(path_type=Path, exists=True))
@click.argument("out_dir", type=click.Path(path_type=Path))
@click.option(
    "--dtype", type=click.Choice(["float32", "float16", "bfloat16"]), help="Cast (default: keep)."
)
@click.option("--force", is_flag=True, help="Replace OUT_DIR if it exists.")
@click.option("-q", "--quantize", "quantize", is_flag=True, help="Quantize (MLX affine format).")
@click.option(
    "--q-bits", type=click.Choice(["2", "3", "4", "5", "6", "8"]), default="4", show_default=True
)
@click.option(
    "--q-group-size", type=click.Choice(["32", "64", "128"]), default="64", show_default=True
)
def convert(hf_dir, out_dir, dtype, force, quantize, q_bits, q_group_size):
    """Convert a Hugging Face checkpoint (safetensors; Qwen2/2.5, Qwen3, Llama, Gemma 3, Phi-3)
    or a GGUF file to an mlxbatch directory,
    optionally quantized in the layout mlx-lm writes and loads."""
    from ..model.convert import convert_hf
    from ..model.gguf_convert import convert_gguf, gguf_path

    if gguf_path(hf_dir):
        if quantize or dtype:
            fail("convert: a GGUF is written as it is stored (no --dtype, --quantize)")
        m = convert_gguf(hf_dir, out_dir, force)
        g = m["gguf"]
        click.echo(
            f"wrote {out_dir}: {m['tensors']} tensors from a {g['architecture']} "
            f"{g['quantization']} GGUF, weights {g['weights']}"
        )
        return
    if not hf_dir.is_dir():
        fail(f"{hf_dir}: neither a checkpoint directory nor a GGUF file")
    bits = int(q_bits) if quantize else None
    m = convert_hf(hf_dir, out_dir, dtype, force, bits, int(q_group_size))
    dtypes = m["dtype"] if isinstance(m["dtype"], str) else " and ".join(m["dtype"])
    stored = (
        f"{m['parameters']:,} stored values ({bits}-bit weights packed into uint32)"
        if bits
        else f"{m['parameters']:,} parameters"
    )
    click.echo(f"wrote {out_dir}: {m['tensors']} tensors, {stored}, {dtypes}")


@click.command("init-random")
@click.argument("out_dir", type=click.Path(path_type=Path))
@click.option(
    "--preset",
    type=click.Choice(list(PRESETS)),
    default="qwen2.5-0.5b",
    show_default=True,
)
@click.option("--seed", type=click.IntRange(0), default=0, show_default=True)
@click.option(
    "--dtype",
    type=click.Choice(["float32", "float16", "bfloat16"]),
    default="bfloat16",
    show_default=True,
)
@click.option("--force", is_flag=True, help="Replace OUT_DIR if it exists.")
def init_random_cmd(out_dir, preset, seed, dtype, force):
    """Write a SYNTHETIC model (random weights, real Qwen tokenizer) at a preset's shapes."""
    from ..model.convert import init_random

    m = init_random(out_dir, preset, seed, dtype, force)
    click.echo(f"wrote {out_dir}: synthetic {preset}, {m['parameters']:,} parameters, {dtype}")


@click.command()
@click.argument("hf_dir", type=click.Path(path_type=Path, exists=True))
@click.option(
    "--mlx",
    "mlx_dir",
    type=click.Path(path_type=Path),
    help="Converted directory (default: convert now).",
)
@click.option("--no-mlx-lm", is_flag=True, help="Skip the comparison with mlx-lm.")
def parity(hf_dir, mlx_dir, no_mlx_lm):
    """Compare logits with PyTorch transformers (fp32) and mlx-lm on the same weights (a
    checkpoint directory, or a GGUF file as transformers loads it)."""
    import importlib.util
    import tempfile

    from ..bench.parity import NotCompared, run_parity
    from ..errors import UsageError

    missing = [m for m in ("torch", "transformers") if importlib.util.find_spec(m) is None]
    if missing:
        raise UsageError(
            f"parity needs {' and '.join(missing)}: pip install 'mlxbatch[parity]' "
            "(install torch==2.13.0 first for the CPU build)"
        )
    from ..model.convert import convert_hf
    from ..model.gguf_convert import cached_model_dir, gguf_path

    if gguf_path(hf_dir) and mlx_dir is None:
        mlx_dir = cached_model_dir(hf_dir)  # what `--model FILE.gguf` runs
    elif not hf_dir.is_dir():
        fail(f"{hf_dir}: neither a checkpoint directory nor a GGUF file")
    with tempfile.TemporaryDirectory() as tmp:
        if mlx_dir is None:
            mlx_dir = Path(tmp) / "mlx"
            convert_hf(hf_dir, mlx_dir, "float32")
        reports = run_parity(hf_dir, mlx_dir, with_mlx_lm=not no_mlx_lm)
    for r in reports:  # every comparison made, then why one could not be
        if not isinstance(r, NotCompared):
            click.echo(r.line())
    for r in reports:
        if isinstance(r, NotCompared):
            hint = (
                "; --no-mlx-lm compares with transformers alone" if r.reference == "mlx-lm" else ""
            )
            fail(f"parity: {r.reference} could not run the checkpoint ({r.why}){hint}")
    sys.exit(0 if all(r.passed for r in reports) else 1)


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def models(as_json):
    """The models mlxbatch can run: under weights/ (or $MLXBATCH_WEIGHTS), the GGUFs in Ollama's
    store and LM Studio's folders, and the Hugging Face cache."""
    import json

    from ..model.defaults import not_runnable, weights_dir
    from ..model.hub import list_models

    found = list_models(weights_dir())
    for m in found:  # a GGUF listed was read whole already; a directory's check is here
        m["broken"] = None if m.get("gguf") else not_runnable(Path(m["path"]))
    if as_json:
        click.echo(json.dumps(found, indent=2))
        return
    if not found:
        click.echo(f"no runnable model under {weights_dir()}/ or in the Hugging Face cache")
    for m in found:
        tags = [m["kind"], m["family"], m["size"]] + (
            [m["quantization"]] if m["quantization"] else []
        )
        tags += ["SYNTHETIC"] if m["synthetic"] else []
        # listed, and yet `--model NAME` runs another snapshot (offline: none); its path runs it
        tags += ["not refs/main: run it by its path"] if m.get("main") is False else []
        tags += [f"BROKEN: {m['broken']}"] if m["broken"] else []
        click.echo(f"{m['name']:<40} {', '.join(tags):<45} {m['path']}")
