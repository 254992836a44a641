"""The light runtime's footprint (issue 37): what a device pays for `nestflex.deploy` on onnxruntime
without torch, against the previous runtime (commit 2a8fdf1, torch + its synthesized plans).

    python benchmarks/deploy/deploy_footprint.py --bundle runs/vgg_default/bundle.nfx \\
        --bundle runs/vgg_mnist/bundle.nfx --out docs/results/deploy_footprint/default

Measured, each in fresh processes (``benchmarks/deploy/_footprint_child.py``, one JSON line each):

* **installed size**: a deploy-only venv made here (``python -m venv`` + ``pip install -c
  constraints.txt <repo>``, no extra), its site-packages summed file by file (apparent size,
  1 MB = 1e6 bytes), with and without the pip and setuptools that ``venv`` puts in every venv; the
  goal is judged on the packages nestflex brings. ``import torch`` and ``import onnx`` must fail there;
* **memory and start-up**, in that venv, ``--processes`` fresh processes per bundle: import +
  load time, VmHWM right after load (peak RSS so far), VmRSS after every level ran once and both
  exit sets once batched (8) and once on one frame, with the tuned plan;
* **per-level latency** at batch 1 and 8: today's runtime (that venv, its ``nestflex tune`` plan
  with ``--batches 1 8``) against the previous runtime (the full venv's python with
  ``PYTHONPATH`` on ``git archive 2a8fdf1``'s ``src``, its own ``nestflex tune`` plan), on copies
  of the same bundle; ``--latency-processes`` pairs of processes, the order alternating
  (old-new, new-old, ...); per process the median of ``--repeats`` calls per level, then the
  median over processes; the goal is the worst new/old ratio;
* **early-exit answers** on the bundle's samples (both exit sets, batched and one frame at a
  time): exit index, answering exit and predicted class, today's against the previous runtime's;
* **level switches** (every ordered pair, ``--switch-repeats`` each, a frame run before and after):
  the worst pair's median, and the onnxruntime sessions built by a switch or the frame after it
  (counted by wrapping ``onnxruntime.InferenceSession``), for both runtimes.

The tuning runs with the full venv's python (today's tuner needs ``onnx``, the ``tune`` extra, for
int8 and the fused exit graph; it stores what the device needs beside the bundle), so the deploy
venv runs what ``nestflex tune`` chose. Plans already beside the copies in ``--work`` are reused.

Writes ``--out/summary.json``: ``goals`` (one entry per acceptance goal of issue 37 measured
here: target, measured per bundle, met, note), ``venv``, ``bundles`` (every raw figure), ``machine``,
the load average before and after, ``args``. The engine and split benchmarks' goals are theirs
(benchmarks/engine/multitenant_live.py, benchmarks/split/split_live.py).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: the repository root, for benchmarks.*
from benchmarks._common import ROOT as REPO, add_out_args, resolve_out, write_run  # noqa: E402

CHILD = Path(__file__).resolve().parent / "_footprint_child.py"
MB = 1e6
#: what `python -m venv` installs in every venv (ensurepip), not what nestflex brings
TOOLING = ("pip", "setuptools", "pkg_resources", "_distutils_hack", "distutils-precedence.pth", "wheel")
PREVIOUS = "2a8fdf1"

__all__ = ["bundle_label", "compare_answers", "distribution_of", "entry_sizes", "goal", "import_time_by_package",
           "main", "ratio_table", "split_tooling", "worst_switch"]


# ------------------------------------------------------------------------------- pure helpers


def entry_sizes(site_packages: str | os.PathLike) -> dict[str, int]:
    """Apparent bytes (sum of file sizes, symlinks not followed) of every top-level entry of
    ``site_packages``: a package folder, a ``*.dist-info``, a module file, a ``.pth``."""
    root = Path(site_packages)
    sizes: dict[str, int] = {}
    for entry in sorted(root.iterdir()):
        if entry.is_dir() and not entry.is_symlink():
            total = 0
            for folder, _, files in os.walk(entry):
                total += sum(os.lstat(os.path.join(folder, f)).st_size for f in files)
            sizes[entry.name] = total
        else:
            sizes[entry.name] = os.lstat(entry).st_size
    return sizes


def distribution_of(entry: str) -> str:
    """The name an entry of site-packages belongs to: ``pip-23.2.1.dist-info`` -> ``pip``,
    ``numpy.libs`` -> ``numpy``, ``lz4`` -> ``lz4``, ``typing_extensions.py`` -> ``typing_extensions``.

    >>> [distribution_of(e) for e in ("pip-23.2.1.dist-info", "numpy.libs", "typing_extensions.py", "__pycache__")]
    ['pip', 'numpy', 'typing_extensions', '__pycache__']
    """
    for suffix in (".dist-info", ".egg-info"):
        if entry.endswith(suffix):
            return entry[: -len(suffix)].rsplit("-", 1)[0]
    for suffix in (".libs", ".py"):
        if entry.endswith(suffix):
            return entry[: -len(suffix)]
    return entry


def split_tooling(sizes: Mapping[str, int], tooling: Iterable[str] = TOOLING) -> tuple[dict[str, int], dict[str, int]]:
    """``sizes`` (:func:`entry_sizes`) grouped by :func:`distribution_of` and split into
    (what the packages brought, what venv's own tooling is: pip, setuptools and their helpers)."""
    tooling = set(tooling)
    brought: dict[str, int] = {}
    tools: dict[str, int] = {}
    for entry, size in sizes.items():
        name = distribution_of(entry)
        group = tools if name in tooling or entry in tooling else brought
        group[name] = group.get(name, 0) + size
    return brought, tools


def bundle_label(path: str | os.PathLike) -> str:
    """A short name for a bundle: its run folder for ``<run>/bundle.nfx``, else its own stem.

    >>> bundle_label("runs/vgg_default/bundle.nfx"), bundle_label("/tmp/x/shipped.nfx")
    ('vgg_default', 'shipped')
    """
    p = Path(path)
    return p.parent.name if p.name == "bundle.nfx" and p.parent.name else p.name.removesuffix(".nfx")


def ratio_table(new: list[dict[str, Any]], old: list[dict[str, Any]]) -> dict[str, Any]:
    """Per batch size and level, the median over processes of today's and the previous runtime's
    per-process medians, and the ratio (new / old) judged: the median over process pairs of each
    pair's ratio (pair ``r`` ran back to back, so a slow minute of the shared machine slows both);
    with the worst ratio.

    ``new`` / ``old``: the ``latency`` objects of the latency children, ``{batch: [{level, backend,
    ms}, ...]}``, one per process, ``new[r]`` and ``old[r]`` the pair run together.
    """
    table: dict[str, list[dict[str, Any]]] = {}
    worst = None
    for batch in sorted(new[0], key=int):
        rows = []
        for k in range(len(new[0][batch])):
            n = statistics.median(run[batch][k]["ms"] for run in new)
            o = statistics.median(run[batch][k]["ms"] for run in old)
            pairs = [a[batch][k]["ms"] / b[batch][k]["ms"] if b[batch][k]["ms"] > 0 else float("inf")
                     for a, b in zip(new, old)]
            ratio = statistics.median(pairs)
            worst = ratio if worst is None else max(worst, ratio)
            rows.append({"level": k, "new_ms": round(n, 5), "old_ms": round(o, 5), "ratio": round(ratio, 4),
                         "ratio_of_medians": round(n / o if o > 0 else float("inf"), 4),
                         "ratio_per_pair": [round(v, 4) for v in pairs],
                         "new_backend": new[0][batch][k]["backend"], "old_backend": old[0][batch][k]["backend"],
                         "new_ms_per_process": [round(run[batch][k]["ms"], 5) for run in new],
                         "old_ms_per_process": [round(run[batch][k]["ms"], 5) for run in old]})
        table[batch] = rows
    return {"batches": table, "worst_ratio": None if worst is None else round(worst, 4)}


def exit_ratio_table(new: list[dict[str, Any]], old: list[dict[str, Any]]) -> dict[str, Any]:
    """Per exit set and batch size, with every stage and head run (no sample leaving early): the
    median over processes of each runtime's per-process median, and the median over process pairs
    of new / old, as :func:`ratio_table` does for levels. Reported, not a goal; a side whose child
    could not time the sets gives ``errors``.

    ``new`` / ``old``: the ``exits`` objects of the latency children, ``{set: {batch: ms}}`` or
    ``{"error": ...}``, one per process, ``new[r]`` and ``old[r]`` the pair run together.
    """
    errors = sorted({f"{side}: {run['error']}" for side, runs in (("new", new), ("old", old))
                     for run in runs if "error" in run})
    pairs = [(a, b) for a, b in zip(new, old) if "error" not in a and "error" not in b]
    table: dict[str, dict[str, Any]] = {}
    for key in (pairs[0][0] if pairs else {}):
        table[key] = {}
        for batch in pairs[0][0][key]:
            n = [a[key][batch] for a, _ in pairs]
            o = [b[key][batch] for _, b in pairs]
            table[key][batch] = {"new_ms": round(statistics.median(n), 5), "old_ms": round(statistics.median(o), 5),
                                 "ratio": round(statistics.median(x / y for x, y in zip(n, o) if y > 0), 4)}
    return {"sets": table, "pairs": len(pairs), "errors": errors}


def worst_switch(pairs: list[dict[str, Any]]) -> dict[str, Any]:
    """The worst ordered pair by its median switch time, and the slowest single switch."""
    by_median = max(pairs, key=lambda p: p["median_ms"])
    by_max = max(pairs, key=lambda p: p["max_ms"])
    return {"worst_median_ms": round(by_median["median_ms"], 4), "worst_pair": [by_median["from"], by_median["to"]],
            "slowest_single_ms": round(by_max["max_ms"], 4), "slowest_pair": [by_max["from"], by_max["to"]]}


def compare_answers(new: Mapping[str, Any], old: Mapping[str, Any]) -> dict[str, Any]:
    """Per exit set and mode (batched, single), how many samples differ in exit index, answering
    exit or predicted class between the two runtimes, and the largest logit difference."""
    out: dict[str, Any] = {}
    total = 0
    for key in sorted(set(new) & set(old)):
        if not isinstance(new[key], Mapping):
            continue
        for mode in ("batched", "single"):
            a, b = new[key][mode], old[key][mode]
            differ = sum(1 for i in range(len(a["prediction"]))
                         if (a["exit_index"][i], a["answer_index"][i], a["prediction"][i])
                         != (b["exit_index"][i], b["answer_index"][i], b["prediction"][i]))
            diff = max((abs(x - y) for ra, rb in zip(a["logits"], b["logits"]) for x, y in zip(ra, rb)), default=0.0)
            out[f"{key}.{mode}"] = {"samples": len(a["prediction"]), "differing": differ,
                                    "max_logit_diff": round(diff, 7)}
            total += differ
    missing = sorted((set(new) ^ set(old)) - {"samples", "inputs"})
    return {"sets": out, "differing": total, "missing_sets": missing}


def import_time_by_package(text: str, top: int = 12) -> dict[str, float]:
    """``python -X importtime`` output (its stderr) as milliseconds of own import time per top-level
    package, the largest ``top`` first (where an import's time goes, not the nesting).

    >>> import_time_by_package("import time: self [us] | cumulative | imported package\\n"
    ...                        "import time:      1500 |       2000 |   numpy.core\\n"
    ...                        "import time:       500 |       2500 | numpy\\n"
    ...                        "import time:      3000 |       3000 | asyncio\\n")
    {'asyncio': 3.0, 'numpy': 2.0}
    """
    totals: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("import time:"):
            continue
        fields = line[len("import time:"):].split("|")
        if len(fields) != 3 or not fields[0].strip().isdigit():
            continue  # the header line
        package = fields[2].strip().split(".")[0]
        totals[package] = totals.get(package, 0.0) + int(fields[0]) / 1e3
    ranked = sorted(totals.items(), key=lambda kv: -kv[1])[:top]
    return {k: round(v, 3) for k, v in ranked}


def goal(target: str, measured: Any, met: bool, note: str, **extra: Any) -> dict[str, Any]:
    return {"target": target, "measured": measured, "met": bool(met), "note": note, **extra}


# ------------------------------------------------------------------------------ processes


def run_json(cmd: list[str], env: Mapping[str, str] | None = None, timeout: float = 1800) -> dict[str, Any]:
    """Run ``cmd``; its last stdout line parsed as JSON (an ``error`` object if it failed)."""
    done = subprocess.run(cmd, capture_output=True, text=True, env=None if env is None else {**os.environ, **env},
                          timeout=timeout)
    if done.returncode != 0:
        return {"error": f"exit {done.returncode}: {done.stderr.strip()[-2000:]}"}
    try:
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return {"error": f"no JSON on stdout: {done.stdout[-500:]!r} {done.stderr[-1500:]!r}"}


def _quiet(cmd: list[str]) -> None:
    """Run ``cmd``; its output only if it fails (pip warns about every index location)."""
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {done.returncode}:\n{done.stdout[-2000:]}{done.stderr[-3000:]}")


def deploy_venv(path: Path, log) -> dict[str, Any]:
    """Create (unless present) the deploy-only venv and measure its site-packages."""
    created = None
    pip = [str(path / "bin" / "pip"), "install", "--quiet", "-c", str(REPO / "constraints.txt")]
    if not (path / "bin" / "python").exists():
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
        _quiet([*pip, str(REPO)])
        created = round(time.perf_counter() - start, 1)
        log(f"deploy venv: created in {created} s")
    else:  # a kept venv: today's nestflex again, its dependencies as they are
        _quiet([*pip, "--no-deps", "--force-reinstall", str(REPO)])
    python = str(path / "bin" / "python")
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    sizes = entry_sizes(site)
    brought, tools = split_tooling(sizes)
    imports = {pkg: subprocess.run([python, "-c", f"import {pkg}"], capture_output=True).returncode != 0
               for pkg in ("torch", "onnx")}
    packages = json.loads(subprocess.run([python, "-m", "pip", "list", "--format", "json"], capture_output=True,
                                         text=True, check=True).stdout)
    timed = subprocess.run([python, "-X", "importtime", "-c", "import nestflex.deploy"], capture_output=True, text=True)
    total, brought_total = sum(sizes.values()), sum(brought.values())
    return {"path": str(path), "python": python, "site_packages": site, "created_s": created,
            "total_mb": round(total / MB, 2), "brought_mb": round(brought_total / MB, 2),
            "tooling_mb": round(sum(tools.values()) / MB, 2),
            "brought": {k: round(v / MB, 3) for k, v in sorted(brought.items(), key=lambda kv: -kv[1])},
            "tooling": {k: round(v / MB, 3) for k, v in sorted(tools.items(), key=lambda kv: -kv[1])},
            "import_fails": imports, "packages": {p["name"]: p["version"] for p in packages},
            # one process, after the measured ones' warm-up: where `import nestflex.deploy`'s time goes
            "import_ms_by_package": import_time_by_package(timed.stderr)}


def previous_source(work: Path, commit: str) -> Path:
    """The previous runtime's ``src``, from ``git archive`` (no worktree: nothing in the repo changes)."""
    dest = work / f"previous_{commit}"
    if not (dest / "src" / "nestflex" / "deploy").is_dir():
        dest.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "-C", str(REPO), "archive", commit, "src"], capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    return dest / "src"


def tune(python: str, module: str, bundle: Path, repeats: int, env: Mapping[str, str] | None, log) -> dict[str, Any]:
    """``nestflex tune`` (today's ``-m nestflex``, the previous ``-m nestflex.deploy``) with
    ``--batches 1 8`` unless a plan is beside ``bundle`` already; the plan's choices."""
    plan = bundle.with_name(bundle.name + ".plan.json")
    seconds = None
    if not plan.exists():
        start = time.perf_counter()
        done = subprocess.run([python, "-m", module, "tune", str(bundle), "--batches", "1", "8", "--repeats",
                               str(repeats), "--quiet"], capture_output=True, text=True,
                              env=None if env is None else {**os.environ, **env}, timeout=3600)
        if done.returncode != 0:
            return {"error": f"tune exited {done.returncode}: {done.stderr.strip()[-2000:]}"}
        seconds = round(time.perf_counter() - start, 1)
        log(f"  tuned {bundle} with {module} in {seconds} s")
    data = json.loads(plan.read_text())
    return {"plan": str(plan), "tune_s": seconds, "reused": seconds is None,
            "levels": [(lp.get("backend"), lp.get("threads")) for lp in data.get("levels", [])],
            "batches": {b: [(lp.get("backend"), lp.get("threads")) for lp in lps]
                        for b, lps in (data.get("batches") or {}).items()},
            "exits": {k: {"backend": e.get("backend"), "threads": e.get("threads"), "active": e.get("active")}
                      for k, e in (data.get("exits") or {}).items()}}


def child(python: str, mode: str, api: str, bundle: Path, env: Mapping[str, str] | None, *extra: str) -> dict[str, Any]:
    return run_json([python, str(CHILD), mode, str(bundle), "--api", api, *extra], env)


def summarize_footprint(runs: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return {"error": runs[0].get("error") if runs else "no run", "processes": 0}

    def mb(values):
        return [round(v / MB, 2) for v in values]

    rss = [r["after_run"]["VmRSS"] for r in ok]
    hwm = [r["after_load"]["VmHWM"] for r in ok]
    return {"processes": len(ok), "errors": [r["error"] for r in runs if "error" in r],
            "import_load_s_median": round(statistics.median(r["import_load_s"] for r in ok), 4),
            "import_s_median": round(statistics.median(r["import_s"] for r in ok), 4),
            "load_s_median": round(statistics.median(r["load_s"] for r in ok), 4),
            "runtime_ready_s_median": round(statistics.median(r["runtime_ready_s"] for r in ok), 4),
            "import_load_s": [round(r["import_load_s"], 4) for r in ok],
            "rss_after_run_mb_max": max(mb(rss)), "rss_after_run_mb": mb(rss),
            "rss_after_load_mb": mb(r["after_load"]["VmRSS"] for r in ok),
            "peak_rss_load_mb_max": max(mb(hwm)), "peak_rss_load_mb": mb(hwm),
            "peak_rss_run_mb": mb(r["after_run"]["VmHWM"] for r in ok),
            "rss_anon_after_run_mb": mb(r["after_run"].get("RssAnon", 0) for r in ok),
            "rss_file_after_run_mb": mb(r["after_run"].get("RssFile", 0) for r in ok),
            "backends": ok[0]["backends"], "exit_sets": ok[0]["exit_sets"],
            "heavy": sorted({m for r in ok for m in r["heavy"]}), "nestflex": ok[0]["nestflex"]}


# --------------------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bundle", action="append", required=True, help="a bundle to measure (repeat for more)")
    add_out_args(p, "summary.json and run.json")
    p.add_argument("--work", default=None, help="keep the deploy venv, the previous source, the bundle copies and "
                                                "their plans here (reused when present; default: a temp folder, removed)")
    p.add_argument("--processes", type=int, default=7, help="fresh processes for import/load time and memory (>= 7)")
    p.add_argument("--previous-processes", type=int, default=3, help="the same for the previous runtime")
    p.add_argument("--latency-processes", type=int, default=9, help="process pairs (old, new) for per-level latency")
    p.add_argument("--repeats", type=int, default=200, help="timed calls per level in one latency process")
    p.add_argument("--switch-repeats", type=int, default=10, help="timed switches per ordered level pair")
    p.add_argument("--tune-repeats", type=int, default=30, help="`nestflex tune --repeats` for both plans")
    p.add_argument("--answer-samples", type=int, default=512, help="bundle samples the early-exit answers compare on")
    p.add_argument("--previous", default=PREVIOUS, help="commit of the previous runtime")
    p.add_argument("--new-python", default=None, help="python of today's runtime (default: the deploy venv's)")
    p.add_argument("--tune-python", default=sys.executable, help="python that tunes today's plan (needs nestflex[tune])")
    p.add_argument("--old-python", default=sys.executable, help="python with torch for the previous runtime")
    p.add_argument("--skip-previous", action="store_true", help="no comparison with the previous runtime")
    a = p.parse_args(argv)
    for name in ("processes", "previous_processes", "latency_processes", "repeats", "switch_repeats",
                 "tune_repeats", "answer_samples"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(a, name)}")
    for b in a.bundle:
        if not (Path(b) / "manifest.json").is_file():
            p.error(f"--bundle {b!r} is not a bundle (no manifest.json)")
    resolve_out(a, __file__)
    return a


def measure_bundle(src: Path, work: Path, venv: dict[str, Any], old_src: Path | None, args, log) -> dict[str, Any]:
    label = bundle_label(src)
    log(f"{label}: {src}")
    copies = {}
    for side in ("new", "old") if old_src is not None else ("new",):
        dest = work / label / side / "bundle.nfx"
        if not dest.exists():
            shutil.copytree(src, dest)
        copies[side] = dest
    old_env = None if old_src is None else {"PYTHONPATH": str(old_src)}
    new_python = args.new_python or venv["python"]
    tune_env = {"PYTHONPATH": str(REPO / "src")}
    result: dict[str, Any] = {"bundle": str(src), "label": label}
    result["plans"] = {"new": tune(args.tune_python, "nestflex", copies["new"], args.tune_repeats, tune_env, log)}
    if old_src is not None:
        result["plans"]["old"] = tune(args.old_python, "nestflex.deploy", copies["old"], args.tune_repeats, old_env, log)

    child(new_python, "footprint", "new", copies["new"], None)  # warm the page cache: not counted
    log(f"  footprint: {args.processes} processes")
    result["new"] = summarize_footprint([child(new_python, "footprint", "new", copies["new"], None)
                                         for _ in range(args.processes)])
    log(f"  footprint without the fused early-exit graphs: {args.processes} processes")
    result["new_unfused"] = summarize_footprint([child(new_python, "footprint", "new", copies["new"], None, "--unfused")
                                                 for _ in range(args.processes)])
    if old_src is not None:
        log(f"  previous footprint: {args.previous_processes} processes")
        result["old"] = summarize_footprint([child(args.old_python, "footprint", "old", copies["old"], old_env)
                                             for _ in range(args.previous_processes)])
        log(f"  latency: {args.latency_processes} process pairs")
        runs: dict[str, list[dict[str, Any]]] = {"new": [], "old": []}
        exit_runs: dict[str, list[dict[str, Any]]] = {"new": [], "old": []}
        errors = []
        for r in range(args.latency_processes):
            for side in (("old", "new") if r % 2 == 0 else ("new", "old")):
                python, env = (new_python, None) if side == "new" else (args.old_python, old_env)
                got = child(python, "latency", side, copies[side], env, "--repeats", str(args.repeats))
                if "error" in got:
                    errors.append(f"{side}: {got['error']}")
                else:
                    runs[side].append(got["latency"])
                    exit_runs[side].append(got.get("exits", {}))
        result["latency"] = ratio_table(runs["new"], runs["old"]) if runs["new"] and runs["old"] else {}
        result["latency"]["errors"] = errors
        result["latency"]["exits"] = exit_ratio_table(exit_runs["new"], exit_runs["old"])
        log("  early-exit answers")
        answers = {side: child(python, "answers", side, copies[side], env, "--samples", str(args.answer_samples))
                   for side, python, env in (("new", new_python, None), ("old", args.old_python, old_env))}
        bad = {s: a["error"] for s, a in answers.items() if "error" in a}
        result["answers"] = {"error": bad} if bad else {
            "samples": answers["new"]["samples"], "inputs": answers["new"]["inputs"],
            **compare_answers(answers["new"], answers["old"])}
    log("  level switches")
    result["switch"] = {}
    for side, copy in copies.items():
        python, env = (new_python, None) if side == "new" else (args.old_python, old_env)
        got = child(python, "switch", side, copy, env, "--repeats", str(args.switch_repeats))
        result["switch"][side] = got if "error" in got else {**worst_switch(got["pairs"]), **got}
    return result


def _per_bundle(results: list[dict[str, Any]], get) -> dict[str, Any]:
    out = {}
    for r in results:
        try:
            out[r["label"]] = get(r)
        except (KeyError, TypeError, IndexError):
            out[r["label"]] = None
    return out


def goals(venv: dict[str, Any], results: list[dict[str, Any]], args) -> dict[str, Any]:
    def all_within(values: Mapping[str, Any], limit: float) -> bool:
        return bool(values) and all(v is not None and v <= limit for v in values.values())

    g = {"installed_size": goal(
        "<= 200 MB: site-packages of a deploy-only venv", venv["brought_mb"], venv["brought_mb"] <= 200,
        f"a fresh venv with `pip install -c constraints.txt <repo>` (no extra): {venv['total_mb']} MB in all, of "
        f"which {venv['tooling_mb']} MB are the pip and setuptools `python -m venv` puts in every venv; judged on the "
        f"{venv['brought_mb']} MB of the packages nestflex brings (apparent size, 1 MB = 1e6 B); import torch fails: "
        f"{venv['import_fails']['torch']}, import onnx fails: {venv['import_fails']['onnx']}",
        with_tooling_mb=venv["total_mb"])}
    rss = _per_bundle(results, lambda r: r["new"]["rss_after_run_mb_max"])
    g["rss_after_run"] = goal(
        "<= 100 MB: process RSS after import + load + every level and both exit sets once", rss, all_within(rss, 100),
        f"VmRSS, the largest of {args.processes} fresh processes per bundle, tuned plan, deploy-only venv; every level "
        f"once at batch 1, each exit set once at batch 8 and once on one frame",
        previous=_per_bundle(results, lambda r: r["old"]["rss_after_run_mb_max"]))
    rss = _per_bundle(results, lambda r: r["new_unfused"]["rss_after_run_mb_max"])
    g["rss_after_run_unfused"] = goal(
        "<= 100 MB: the same with ProgressiveRuntime(fused=False)", rss, all_within(rss, 100),
        "as rss_after_run, each exit set stage by stage (no fused one-call graph: onnxruntime holds a session "
        "state per If branch of it)")
    hwm = _per_bundle(results, lambda r: r["new"]["peak_rss_load_mb_max"])
    g["peak_rss_load"] = goal("<= 120 MB: peak RSS during load", hwm, all_within(hwm, 120),
                              "VmHWM right after import + load, the largest over the processes",
                              previous=_per_bundle(results, lambda r: r["old"]["peak_rss_load_mb_max"]))
    t = _per_bundle(results, lambda r: r["new"]["import_load_s_median"])
    g["import_load"] = goal("<= 0.5 s median: import + load", t, all_within(t, 0.5),
                            f"`import nestflex.deploy` + `load(bundle)` timed inside the process (interpreter start "
                            f"not included), median of {args.processes} fresh processes after one untimed warm-up "
                            f"process; building the runtime's sessions is bundles[].new.runtime_ready_s_median; "
                            f"own import time per package: venv.import_ms_by_package",
                            previous=_per_bundle(results, lambda r: r["old"]["import_load_s_median"]))
    if not args.skip_previous:
        ratio = _per_bundle(results, lambda r: r["latency"]["worst_ratio"])
        g["level_latency"] = goal(
            "<= 1.05: per-level latency at batch 1 and 8 over the previous runtime's synthesized plan", ratio,
            all_within(ratio, 1.05),
            f"worst level and batch of (today / previous): the median over {args.latency_processes} process pairs "
            f"(run back to back, the order alternating) of the pair's ratio of per-process medians of {args.repeats} "
            f"calls after 20 untimed ones; each runtime with its own "
            f"`nestflex tune --batches 1 8` plan on its own copy of the bundle (bundles[].plans)")
        differ = _per_bundle(results, lambda r: r["answers"]["differing"])
        g["early_exit_answers"] = goal(
            "0 samples whose early-exit answer differs from the previous runtime's", differ,
            bool(differ) and all(v == 0 for v in differ.values()),
            f"exit index, answering exit and predicted class on the bundle's samples (up to {args.answer_samples}; "
            f"seeded random inputs for a bundle without samples: bundles[].answers.inputs), both exit sets, batched "
            f"and one frame at a time, each runtime with its tuned plan")
    sw = _per_bundle(results, lambda r: r["switch"]["new"]["worst_median_ms"])
    g["level_switch"] = goal(
        "<= 5 ms: worst level switch over every ordered pair", sw, all_within(sw, 5.0),
        f"the worst ordered pair's median of {args.switch_repeats} switches (the slowest single switch is "
        f"bundles[].switch.new.slowest_single_ms)",
        previous=_per_bundle(results, lambda r: r["switch"]["old"]["worst_median_ms"]))
    built = _per_bundle(results, lambda r: r["switch"]["new"]["sessions_built_on_switch_and_next_frame"])
    g["no_session_on_frame_path"] = goal(
        "0 sessions built by a level switch or the frame after it", built,
        bool(built) and all(v == 0 for v in built.values()),
        "onnxruntime.InferenceSession constructions counted after every level ran once",
        previous=_per_bundle(results, lambda r: r["switch"]["old"]["sessions_built_on_switch_and_next_frame"]))
    return g


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="deploy_footprint_"))
    work.mkdir(parents=True, exist_ok=True)

    def log(msg: str) -> None:
        print(msg, flush=True)

    from nestflex._machine import machine

    started = time.perf_counter()
    load_before = os.getloadavg()
    try:
        venv = deploy_venv(work / "deploy-venv", log)
        log(f"deploy venv: {venv['brought_mb']} MB brought, {venv['total_mb']} MB with pip/setuptools")
        old_src = None if args.skip_previous else previous_source(work, args.previous)
        results = [measure_bundle(Path(b), work, venv, old_src, args, log) for b in args.bundle]
        summary = {
            "benchmark": "deploy_footprint", "issue": 37,
            "goals": goals(venv, results, args),
            "venv": venv, "bundles": results,
            "previous": None if args.skip_previous else {"commit": args.previous, "python": args.old_python},
            "machine": machine(load_average_before=load_before, load_average_after=os.getloadavg(),
                               note="the deploy venv's own package versions are venv.packages"),
            "seconds_total": round(time.perf_counter() - started, 1),
            "args": {**vars(args), "out": str(args.out)},
        }
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    from nestflex._io import write_json

    write_json(out / "summary.json", summary)
    write_run(out, __file__, argv)
    for name, g in summary["goals"].items():
        log(f"{name}: {g['measured']} (target {g['target']}): {'met' if g['met'] else 'NOT met'}")
    return summary


if __name__ == "__main__":
    main()
