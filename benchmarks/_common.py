"""What the benchmarks share: where results go (``docs/results/<benchmark>/<run>/`` and its
``run.json``), the trained recipe model with its validation split, and a recipe run's test frames.

Every benchmark is a script run by path from the repository root, ``python
benchmarks/<group>/<script>.py``; its first lines put the root on ``sys.path`` so that
``benchmarks._common`` (and its group's own ``_``-modules) import as a package.
``python -m benchmarks.<group>.<script>`` runs it the same way.

**Results.** A benchmark writes ``summary.json`` and its plots into ``--out``, by default
``docs/results/<benchmark>/<--run-name>/`` (the run name defaults to today's date), and beside
them ``run.json`` (:func:`write_run`): the command, the commit, the date, the machine and the
run's status. A new run is ``"new"`` until someone decides what it is: ``"current"`` (the run the
docs quote; one per benchmark), ``{"superseded_by": "<benchmark>/<run>"}`` or
``{"variant_of": "<benchmark>/<run>"}`` (another setting, kept and quoted beside the current one).
``benchmarks/results_index.py`` checks that and writes ``docs/results/index.md``. What is not a
result (checkpoints, recipe runs a benchmark trains) goes to :func:`scratch_dir`, under ``runs/``.

**The recipe model.** A benchmark given ``--checkpoint`` loads it (``weights_only=True``) and
rebuilds the validation split the recipe held out for it from the ``config.json`` next to it
(data, seed, sizes), so the profilers see the same images the recipe's profile stage saw. Without
a checkpoint a small model is trained by the recipe's own baseline stage, not by a second
training loop.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import shlex
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nestflex._io import read_json, write_json
from nestflex._machine import machine

if TYPE_CHECKING:
    import torch

__all__ = [
    "RESULTS",
    "ROOT",
    "add_model_args",
    "add_out_args",
    "labelled_frames",
    "load_model",
    "machine",
    "recipe",
    "recipe_datamodule",
    "resolve_out",
    "scratch_dir",
    "validation_loader",
    "write_run",
]

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
DEFAULT_CHECKPOINT = ROOT / "runs" / "vgg_cifar" / "baseline" / "model.ckpt"
#: the small model trained when no checkpoint exists: minutes on 2 cores, not an hour
SMALL = ["--model", "vgg11", "--width", "0.25", "--epochs", "2", "--max-train-samples", "10000",
         "--synthetic-train-size", "15000", "--synthetic-test-size", "2000", "--val-size", "2000"]


# --- where results go -----------------------------------------------------------------------------

def add_out_args(p: argparse.ArgumentParser, what: str = "summary.json, run.json and the plots") -> None:
    """``--out DIR`` and ``--run-name NAME``: the run's folder, by default
    ``docs/results/<benchmark>/<NAME>/`` (resolved by :func:`resolve_out` after parsing)."""
    p.add_argument("--out", type=Path, default=None,
                   help=f"folder for {what} (default: docs/results/<benchmark>/<--run-name>/)")
    p.add_argument("--run-name", default=None,
                   help="the run's folder under docs/results/<benchmark>/ when --out is not given "
                        "(default: today's date, UTC)")


def resolve_out(args: argparse.Namespace, script: str | Path) -> Path:
    """``args.out`` as a Path, or ``docs/results/<script's name>/<args.run_name or today>/``; set on
    ``args`` and returned."""
    if args.out is None:
        args.out = RESULTS / Path(script).stem / (getattr(args, "run_name", None) or _today())
    args.out = Path(args.out)
    return args.out


def scratch_dir(out: str | Path) -> Path:
    """Where a run keeps what is not a result (checkpoints, the recipe runs it trains): for a run
    under ``docs/results/`` the same path under ``runs/`` (ignored by git), else ``out`` itself."""
    out = Path(out).resolve()
    try:
        return ROOT / "runs" / out.relative_to(RESULTS)
    except ValueError:
        return out


def write_run(out: str | Path, script: str | Path, argv: Sequence[str] | None = None,
              note: str | None = None, machine_record: str | None = None) -> dict[str, Any]:
    """Write ``out/run.json`` beside a run's results and return it.

    ``command`` is the script's path from the root with ``argv`` (default ``sys.argv[1:]``);
    ``commit`` the checked-out commit (marked when tracked files differ from it); ``date`` today
    (UTC); ``machine`` one line of :func:`nestflex._machine.machine`, or ``machine_record`` where the
    figures were measured elsewhere (runs collected from another machine). ``status`` is kept when the
    folder had a ``run.json`` (a re-run in place keeps its place), else ``"new"``.
    """
    out, script = Path(out), Path(script).resolve()
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        where = script.relative_to(ROOT).as_posix()
    except ValueError:
        where = str(script)
    old = out / "run.json"
    status = read_json(old).get("status", "new") if old.is_file() else "new"
    benchmark = out.parent.name if out.resolve().parent.parent == RESULTS else Path(script).stem
    record = {"benchmark": benchmark, "run": out.name, "command": shlex.join(["python", where, *argv]),
              "commit": _commit(), "date": _today(),
              "machine": machine_record or machine_line(machine()), "status": status}
    if note:
        record["note"] = note
    write_json(old, record)
    return record


def machine_line(record: dict[str, Any] | None) -> str:
    """One line for a machine record: CPU, cores, torch threads and GPU where recorded."""
    cores = record.get("cpus") or record.get("cpu_cores") if isinstance(record, dict) else None
    if not isinstance(record, dict) or not (record.get("cpu") or cores):
        return "not recorded"
    parts = [str(record.get("cpu") or "CPU model not recorded")]
    if cores:
        parts.append(f"{cores} cores")
    if record.get("torch_threads"):
        n = record["torch_threads"]
        parts.append(f"{n} torch thread{'' if n == 1 else 's'}")
    if record.get("cuda"):
        parts.append(str(record["cuda"]))
    return ", ".join(parts)


def _today() -> str:
    return datetime.datetime.now(datetime.timezone.utc).date().isoformat()


def _commit() -> str:
    def git(*a: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True, check=False)

    try:
        head = git("rev-parse", "--short", "HEAD")
        if head.returncode:
            return "not recorded"
        dirty = git("diff", "--quiet", "HEAD", "--").returncode != 0
    except OSError:
        return "not recorded"
    return head.stdout.strip() + (" with uncommitted changes" if dirty else "")


# --- the trained recipe model ---------------------------------------------------------------------

def add_model_args(p, samples: int = 1000) -> None:
    """The arguments every single-model profiler benchmark takes: ``--out``/``--run-name``, ``--checkpoint``,
    ``--data-dir`` and ``--samples`` (validation samples for accuracy)."""
    add_out_args(p)
    p.add_argument("--checkpoint", type=Path, default=None,
                   help="recipe checkpoint (default: runs/vgg_cifar/baseline/model.ckpt, else train a small one)")
    p.add_argument("--data-dir", default="data")
    p.add_argument("--samples", type=int, default=samples, help="validation samples for accuracy")


def load_model(checkpoint: Path | None, out: Path, data_dir: str) -> tuple[torch.nn.Module, dict[str, Any], str]:
    """``(model in eval mode, its baseline config, where it came from)``.

    ``checkpoint=None`` uses the default recipe run if it exists, else trains :data:`SMALL`
    under ``scratch_dir(out)/recipe_run`` with the recipe's baseline stage.
    """
    from nestflex.training import ImageClassifier

    if checkpoint is None and DEFAULT_CHECKPOINT.is_file():
        checkpoint = DEFAULT_CHECKPOINT
    if checkpoint is None:
        run = scratch_dir(out) / "recipe_run"
        recipe().main([*SMALL, "--data", "synthetic", "--data-dir", data_dir, "--stages", "baseline", "--out", str(run)])
        checkpoint, source = run / "baseline" / "model.ckpt", f"trained here: recipes/vgg_cifar.py {' '.join(SMALL)}"
    else:
        if not checkpoint.is_file():
            raise SystemExit(f"error: no checkpoint at {checkpoint}. HINT: train one with "
                             f"`python recipes/vgg_cifar.py --stages baseline`, or leave out --checkpoint")
        source = str(checkpoint)
    module = ImageClassifier.load_from_checkpoint(checkpoint, map_location="cpu", weights_only=True)
    config_path = checkpoint.parent / "config.json"
    config = read_json(config_path) if config_path.is_file() else {}
    return module.model.eval(), config, source


def recipe_datamodule(config: dict[str, Any], data_dir: str, batch_size: int = 128):
    """The recipe's DataModule for this model's config, set up: ``(dm, message, synthetic)``."""
    from nestflex.data import resolve_data

    data = config.get("data", {})
    kwargs: dict[str, Any] = {"batch_size": batch_size, "seed": config.get("seed", data.get("seed", 0)),
                              "val_size": config.get("val_size", 5000)}
    if config.get("max_train_samples") is not None:
        kwargs["max_train_samples"] = config["max_train_samples"]
    kind = "cifar10" if data.get("name") == "cifar10" else "synthetic"
    if kind == "synthetic":
        kwargs.update({k: data[k] for k in ("train_size", "test_size") if k in data})
    dm, message = resolve_data(kind, data_dir, **kwargs)
    dm.setup("fit")
    return dm, message, kind == "synthetic"


def validation_loader(config: dict[str, Any], data_dir: str, batch_size: int = 128):
    """The validation split the recipe held out for this model (synthetic unless CIFAR-10 was used)."""
    dm, message, synthetic = recipe_datamodule(config, data_dir, batch_size)
    return dm.val_dataloader(), message, synthetic


def recipe():
    """``recipes/vgg_cifar.py``, loaded as a module (the recipe is a script, not a package module)."""
    spec = importlib.util.spec_from_file_location("vgg_cifar", ROOT / "recipes" / "vgg_cifar.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("vgg_cifar", module)
    spec.loader.exec_module(module)
    return module


# --- a recipe run's test frames ------------------------------------------------------------------

def labelled_frames(run: Path, n: int, mnist_dir: str | None, data_dir: str, seed: int) -> tuple[list, dict[str, Any]]:
    """Labelled test frames of a recipe run for the live benchmarks (multitenant_live, split_live):
    the run's test split, rebuilt from its summary.json, as ``n`` normalised (image, label) pairs."""
    import numpy as np

    from nestflex.data import resolve_data

    data = read_json(run / "summary.json")["data"]
    kind = data["name"] if data["name"] in ("synthetic", "mnist", "cifar10") else "auto"
    kwargs: dict[str, Any] = {"seed": data.get("seed", 0), "batch_size": 256}
    if kind == "synthetic":
        kwargs.update(train_size=data.get("train_size", 50_000), test_size=data.get("test_size", 10_000))
        kwargs["val_size"] = min(5000, kwargs["train_size"] // 10)  # the test split does not depend on it
    where = mnist_dir if kind == "mnist" else data_dir
    if kind == "mnist" and where is None:
        raise SystemExit(f"error: run {str(run)!r} was trained on MNIST; pass --mnist-dir")
    dm, _ = resolve_data(kind, where, **kwargs)
    dm.setup("test")
    frames = []
    for x, y in dm.test_dataloader():
        frames += list(zip(x, y.tolist()))
        if len(frames) >= n:
            break
    order = np.random.default_rng(seed).permutation(len(frames))[:n]
    return [frames[i] for i in order], {"data": data["name"], "synthetic": bool(data.get("synthetic"))}
