"""The structure graph over model zoos: which models trace, prune and stay correct (issue 21).

For each model (random weights, one process per model so a crash or a hang costs one row):
build it, ``trace`` it at ``--size`` x ``--size``, count its groups and split points, compare
its MACs with ``torch.utils.flop_counter`` (FLOPs / 2 of convolutions and matrix products),
check the split points, count the exits placed, prune ``--ratio`` of every prunable group
(random channels), and check

- **split points**: at least one, and at the first, middle and last ``split_model``'s head then
  tail gives the model's output bit for bit (issue 40);
- **exits placed**: how many exits ``nestflex.exits`` places by default (SPINN's positions, or
  one per place when fewer fit); 0 with the reason when none (reported, not a pass condition);
- **pruned = masked**: in float64, the pruned model's output equals the unpruned model's with
  every consumer of a dropped channel ignoring it (its input rows zeroed, at their offset in a
  concatenation), within 1e-8 of the output's scale;
- **MACs as predicted**: a re-trace of the pruned model has exactly the MACs ``graph.macs``
  predicted from the widths.

Then, on a copy of the unpruned model, the same prune with ``trace(..., approximate=True)``
(Torch-Pruning's behaviour on LayerNorm streams, GRN and weight-standardised convs): the row's
``approx`` says how many groups it adds, the MACs left, whether a re-trace has the MACs predicted,
and the measured output change ``|pruned - masked| / |masked|`` (L2 over the logits; 0 when no
group is approximate). It is reported; it counts towards passing only for a model with no group
that prunes exactly (NF-ResNet, ConvNeXt-V2), and then only its MACs as predicted.

    python benchmarks/zoo/zoo_coverage.py --zoo torchvision --out runs/zoo_torchvision
    python benchmarks/zoo/zoo_coverage.py --zoo torchvision --models densenet121,googlenet --out /tmp/z
    # issue 40's approximate goal: ViT-S, DeiT-S and ConvNeXt-T against Torch-Pruning
    python benchmarks/zoo/zoo_coverage.py --zoo timm --torch-pruning \
        --models vit_small_patch16_224,deit_small_patch16_224,convnext_tiny --out docs/results/zoo_coverage/timm_approximate

With ``--torch-pruning`` (``pip install torch-pruning==1.6.1``; not a nestflex dependency) each
model is also pruned by Torch-Pruning's ``MetaPruner`` in its own process, with the settings of
its benchmarks: magnitude (L2) group importance, ``pruning_ratio`` = ``--ratio`` on every layer,
the classifier ignored, attention heads declared (``num_heads``), and passes when the pruned
model still runs and gives logits of the same shape. Its MACs are counted by the same flop counter.

``--jobs N`` checks N models at once (each child gets ``--threads``, default ``cores // N``, torch
threads); every
finished row is appended to ``rows.jsonl`` in ``--out`` at once, and ``--resume`` skips the models
already there, so a run cut short loses nothing.

For timm models the row also says whether ``nestflex.models.create_timm_model`` gives it a CIFAR
stem (32x32 inputs) by its general rule (``cifar_stem``: true, or the error).

Writes ``summary.json`` (one row per model, the counts, the medians of MACs left over the models
both tools prune when Torch-Pruning ran, and the issue's ``goals``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: the repository root, for benchmarks.*
from benchmarks._common import add_out_args, resolve_out, write_run  # noqa: E402

#: a broad timm list: CNNs, mobile nets, hybrids and transformers (the issue asks for >= 50)
TIMM_MODELS = [
    "resnet18", "resnet50", "resnext50_32x4d", "seresnet50", "wide_resnet50_2", "densenet121", "dpn68",
    "inception_v3", "inception_v4", "xception41", "vgg11_bn", "regnetx_002", "regnety_002", "mobilenetv2_100",
    "mobilenetv3_small_100", "mobilenetv3_large_100", "efficientnet_b0", "efficientnet_lite0", "mnasnet_100",
    "ghostnet_100", "hrnet_w18_small", "res2net50_14w_8s", "skresnet18",
    "cspdarknet53", "cspresnet50", "darknet53", "dla34", "rexnet_100", "tinynet_a", "lcnet_050", "fbnetc_100",
    "hardcorenas_a", "nf_resnet26", "resnetv2_50", "convnext_atto", "convnextv2_atto", "edgenext_xx_small",
    "poolformer_s12", "mobilevit_xxs", "mobilevitv2_050", "levit_128s", "efficientformer_l1",
    "efficientformerv2_s0", "vit_tiny_patch16_224", "deit_tiny_patch16_224", "swin_tiny_patch4_window7_224",
    "maxvit_nano_rw_256", "coat_lite_tiny", "mixer_b16_224", "resmlp_12_224", "gmlp_ti16_224", "pit_ti_224",
    "tnt_s_patch16_224", "crossvit_tiny_240", "repvgg_a0",
]


#: models whose stem needs a larger input than the default size
MIN_SIZE = {"inception_v3": 96, "inception_v4": 96, "maxvit_t": 224,  # MaxViT: 7x7 windows in every stage
            "vit_h_14": 70}  # its 14x14 patches must tile the input


def build(zoo: str, name: str, size: int):
    size = max(size, MIN_SIZE.get(name, 0))
    if zoo == "torchvision":
        import torchvision

        kwargs: dict[str, Any] = {}
        if name in ("googlenet", "inception_v3"):
            kwargs = {"aux_logits": False, "init_weights": True}
        if name.startswith("vit_"):
            kwargs["image_size"] = size
        if name.startswith("maxvit"):
            kwargs["input_size"] = (size, size)
        return torchvision.models.get_model(name, weights=None, **kwargs).eval(), (3, size, size)
    import timm

    model = timm.create_model(name, pretrained=False, num_classes=10)
    cfg = getattr(model, "pretrained_cfg", {}) or {}
    fixed = cfg.get("fixed_input_size", False) or name.startswith(("vit_", "deit_", "swin_", "maxvit", "mixer",
                                                                     "resmlp", "gmlp", "pit_", "tnt_", "crossvit",
                                                                     "levit", "efficientformer", "coat"))
    shape = tuple(cfg.get("input_size", (3, 224, 224))) if fixed else (3, size, size)
    return model.eval(), shape


def check_one(zoo: str, name: str, size: int, ratio: float) -> dict[str, Any]:
    """Every step for one model; the row says how far it got and what failed."""
    import copy

    import torch

    from nestflex.graph import trace

    torch.manual_seed(0)
    row: dict[str, Any] = {"model": name, "step": "build"}
    if zoo == "timm":
        row["cifar_stem"] = cifar_stem(name)
    model, shape = build(zoo, name, size)
    row["input_shape"] = list(shape)
    x = torch.randn(2, *shape)
    row["step"] = "trace"
    graph = trace(model, shape)
    row.update(groups=len(graph.groups), prunable=len(graph.prunable_groups), split_points=len(graph.split_points),
               macs=graph.macs(), unsupported=sorted(set(graph.unsupported))[:8])
    row["macs_vs_flop_counter"] = round(graph.macs() / max(1, _flop_macs(model, x[:1])), 4)
    row["step"] = "split"
    row.update(check_splits(model, graph, x))
    row["exits"] = exits_placed(graph)
    original = copy.deepcopy(model)  # the approximate prune starts from the same weights
    if not graph.prunable_groups:
        row.update(step="done", pruned=False, macs_left=1.0)
    else:
        row["step"] = "prune"
        found = prune_and_compare(model, graph, x, ratio, torch.Generator().manual_seed(0))
        row.update(max_abs_diff=found["max_abs_diff"], pruned_equals_masked=found["max_abs_diff"] <= 1e-8 * found["scale"])
        row["step"] = "retrace"
        again = trace(model.float(), shape)
        row.update(macs_as_predicted=again.macs() == found["predicted"],
                   macs_left=round(found["predicted"] / graph.macs(), 4), pruned=True, step="done")
    del model, graph  # the largest models (RegNet-Y-128GF in float64) need the memory for the copy's prune
    try:  # reported beside the row; its failure never fails the exact steps
        row["approx"] = check_approximate(original, shape, x, ratio, row)
    except Exception as e:
        row["approx"] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    return row


def prune_and_compare(model, graph, x, ratio: float, gen) -> dict[str, float]:
    """Prune ``ratio`` of every prunable group of ``graph`` (random channels from ``gen``) in
    float64, after running the masked model (every consumer of a dropped channel ignores it: its
    input rows zeroed); the outputs' largest difference and scale, and the MACs predicted."""
    import torch

    from nestflex.graph import prune_channels

    keep = {g.id: torch.randperm(g.width, generator=gen)[: max(1, round(g.width * (1 - ratio)))]
            for g in graph.prunable_groups}
    predicted = graph.macs({gid: len(k) for gid, k in keep.items()})
    model, x = model.double(), x.double()
    with torch.no_grad():
        for g in graph.prunable_groups:  # consumers ignore the channels about to go
            drop = torch.ones(g.width, dtype=torch.bool)
            drop[keep[g.id]] = False
            drop = drop.nonzero().flatten()
            for m in g.members:
                if m.role == "in" and drop.numel():
                    getattr(model.get_submodule(m.module), m.attr).index_fill_(m.dim, m.rows(g, drop, others=False), 0)
        masked = model(x)
        for g in graph.prunable_groups:
            prune_channels(model, g, keep[g.id])
        pruned = model(x)
    return {"max_abs_diff": (pruned - masked).abs().max().item(), "scale": max(1.0, masked.abs().max().item()),
            "relative_change": ((pruned - masked).norm() / masked.norm().clamp_min(1e-30)).item(),
            "predicted": predicted}


def check_splits(model, graph, x) -> dict[str, Any]:
    """Head then tail = model, bit for bit, at the first, middle and last split point."""
    import torch

    from nestflex.graph import split_model

    points = graph.split_points
    picked = sorted({0, len(points) // 2, len(points) - 1}) if points else []
    out: dict[str, Any] = {"split_checked": len(picked), "split_at": [points[i].name for i in picked]}
    exact = []
    with torch.no_grad():
        want = model(x)
        for i in picked:
            try:  # a cut that fails is this step failing, not the row: pruning is still checked
                head, tail = split_model(graph, points[i])
                exact.append(torch.equal(tail(*head(x)), want))
            except Exception as e:
                exact.append(False)
                out.setdefault("split_error", f"at `{points[i].name}`: {type(e).__name__}: {str(e)[:200]}")
    out["split_exact"] = bool(picked) and all(exact)
    return out


def exits_placed(graph) -> int | str:
    """How many exits nestflex places by default on this backbone, or why none."""
    import warnings

    from nestflex.exits.placement import default_positions, resolve_positions

    try:
        with warnings.catch_warnings():  # fewer places than SPINN's six: the count says so
            warnings.simplefilter("ignore")
            return len(resolve_positions(graph, default_positions(graph)))
    except Exception as e:
        return f"0: {type(e).__name__}: {str(e)[:160]}"


def check_approximate(model, shape, x, ratio: float, row: dict[str, Any]) -> dict[str, Any]:
    """The same prune with ``approximate=True``: groups added, MACs left, the output change."""
    import torch

    from nestflex.graph import trace

    graph = trace(model, shape, approximate=True)
    added = sum(not g.exact for g in graph.prunable_groups)
    out: dict[str, Any] = {"prunable": len(graph.prunable_groups), "approximate_groups": added}
    if not added:  # nothing more to prune: the exact row's figures hold
        out.update(macs_left=row.get("macs_left", 1.0), output_change=0.0, macs_as_predicted=row.get("macs_as_predicted"))
        return out
    found = prune_and_compare(model, graph, x, ratio, torch.Generator().manual_seed(0))
    again = trace(model.float(), shape, approximate=True)
    out.update(macs_left=round(found["predicted"] / graph.macs(), 4), output_change=round(found["relative_change"], 4),
               macs_as_predicted=again.macs() == found["predicted"],
               examples=sorted({g.approximation.split(":")[0] for g in graph.prunable_groups if not g.exact})[:3])
    return out


def cifar_stem(name: str) -> bool | str:
    """True when ``create_timm_model`` adapts the model to 32x32 inputs (its CIFAR stem rule) and
    it then runs on one; else the error."""
    import torch

    from nestflex.models.timm_adapter import create_timm_model

    try:
        model = create_timm_model(name).eval()
        with torch.no_grad():
            out = model(torch.zeros(1, 3, 32, 32))
        return True if out.shape == (1, 10) else f"logits of shape {tuple(out.shape)}"
    except Exception as e:
        return f"{type(e).__name__}: {str(e)[:200]}"


def _flop_macs(model, x) -> int:
    """MACs of one forward by torch.utils.flop_counter (FLOPs / 2), with torch's attention formula
    registered for the CPU kernel of fused attention (``nestflex.graph.flop_counter``: torch counts
    only the CUDA kernels); nn.MultiheadAttention's inference fast path is one fused op the
    counter does not see, so it is off."""
    import torch

    from nestflex.graph import flop_counter

    fastpath = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        with flop_counter(model) as counter, torch.no_grad():
            model(x)
    finally:
        torch.backends.mha.set_fastpath_enabled(fastpath)
    return counter.get_total_flops() // 2


def check_torch_pruning(zoo: str, name: str, size: int, ratio: float) -> dict[str, Any]:
    """Torch-Pruning's MetaPruner on the same model and input (see the module docstring)."""
    import torch
    import torch_pruning as tp

    torch.manual_seed(0)
    model, shape = build(zoo, name, size)
    x = torch.randn(1, *shape)
    with torch.no_grad():
        ref = model(x)
    base = _flop_macs(model, x)
    classes = ref.shape[-1]
    heads = [m for m in model.modules() if isinstance(m, (torch.nn.Linear, torch.nn.Conv2d))
             and getattr(m, "out_features", getattr(m, "out_channels", None)) == classes]
    num_heads = {}
    for m in model.modules():
        if isinstance(m, torch.nn.MultiheadAttention):
            num_heads[m] = m.num_heads
        elif isinstance(getattr(m, "qkv", None), torch.nn.Linear) and isinstance(getattr(m, "num_heads", None), int):
            num_heads[m.qkv] = m.num_heads  # timm attention blocks, as Torch-Pruning's timm benchmark does
    imp_cls = getattr(tp.importance, "GroupMagnitudeImportance", None) or tp.importance.MagnitudeImportance
    pruner = tp.pruner.MetaPruner(model, x, importance=imp_cls(p=2), pruning_ratio=ratio, ignored_layers=heads[-1:],
                                  num_heads=num_heads)
    pruner.step()
    for m in model.modules():  # what Torch-Pruning's ViT examples do after a step: the heads' sizes follow
        qkv = getattr(m, "qkv", None)
        if qkv in num_heads and isinstance(getattr(m, "head_dim", None), int):
            m.num_heads = pruner.num_heads.get(qkv, m.num_heads)
            m.head_dim = qkv.out_features // (3 * m.num_heads)
            if isinstance(getattr(m, "attn_dim", None), int):
                m.attn_dim = m.num_heads * m.head_dim
    with torch.no_grad():
        out = model(x)
    if out.shape != ref.shape:
        raise RuntimeError(f"pruned output shape {tuple(out.shape)} != {tuple(ref.shape)}")
    return {"model": name, "tp_macs_left": round(_flop_macs(model, x) / base, 4)}


#: the issue's goals: models passing every step per zoo (issue 40: split points included), and
#: how close the MACs must be
GOAL_PASSED = {"torchvision": 79 / 80, "timm": 52 / 55}
GOAL_MEDIAN_GAP = 0.05
#: issue 40: with approximate=True, the median MACs left on these models within GOAL_MEDIAN_GAP of
#: Torch-Pruning's (a run with ``--models`` naming them and ``--torch-pruning`` measures it)
APPROX_GOAL_MODELS = ("vit_small_patch16_224", "deit_small_patch16_224", "convnext_tiny")
GOAL_MACS_TOLERANCE = 0.01
#: a model pruned to more than this share of its MACs passes, and its goal note names it
BARELY_PRUNED = 0.99


def run_child(zoo: str, name: str, size: int, ratio: float, timeout: float, tool: str = "nestflex",
              threads: int | None = None) -> dict[str, Any]:
    flag = "--one" if tool == "nestflex" else "--one-tp"
    cmd = [sys.executable, __file__, flag, name, "--zoo", zoo, "--size", str(size), "--ratio", str(ratio)]
    env = dict(os.environ)
    if threads:  # torch reads these at start; N children at once share the cores
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"model": name, "ok": False, "error": f"timed out after {timeout:.0f} s", "seconds": round(timeout, 1)}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    row = json.loads(lines[-1]) if lines else {"model": name, "ok": False,
                                                "error": (proc.stderr.strip().splitlines() or ["?"])[-1][:300]}
    row["seconds"] = round(time.perf_counter() - start, 1)
    return row


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--zoo", choices=["torchvision", "timm"], default="torchvision")
    p.add_argument("--models", default=None, help="comma list (default: every torchvision classification model, "
                                                   "or the timm list in this file)")
    p.add_argument("--size", type=int, default=64, help="input height and width (fixed-size models use their own)")
    p.add_argument("--ratio", type=float, default=0.3, help="share of every prunable group to remove")
    p.add_argument("--timeout", type=float, default=600, help="seconds per model")
    add_out_args(p, "summary.json, rows.jsonl, table.md and run.json")
    p.add_argument("--jobs", type=int, default=1, help="models checked at once (default 1)")
    p.add_argument("--threads", type=int, default=None, help="torch threads per model (default: cores // jobs)")
    p.add_argument("--resume", action="store_true", help="keep the rows already in OUT/rows.jsonl, check the rest")
    p.add_argument("--torch-pruning", action="store_true",
                   help="also prune each model with Torch-Pruning (pip install torch-pruning==1.6.1)")
    p.add_argument("--one", help=argparse.SUPPRESS)
    p.add_argument("--one-tp", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if not 0 < a.ratio < 1:
        p.error(f"--ratio is a share in (0, 1), got {a.ratio}")
    if a.jobs < 1:
        p.error(f"--jobs is a count of models checked at once, at least 1, got {a.jobs}")
    if a.one:
        try:
            row = {**check_one(a.zoo, a.one, a.size, a.ratio), "ok": True}
        except Exception as e:  # the row records the failure; the parent goes on with the next model
            row = {"model": a.one, "ok": False, "error": f"{type(e).__name__}: {str(e)[:300]}"}
        ok = row.get("step") == "done" and row.get("pruned_equals_masked", True) and row.get("macs_as_predicted", True)
        row["ok"] = bool(row["ok"] and ok)
        # issue 40: every step includes a split point at which head then tail is the model; a model
        # with no group that prunes exactly (NF-ResNet, ConvNeXt-V2) passes the prune step with
        # approximate=True when that prune runs and its MACs are as predicted (row["approx"])
        ap = row.get("approx") or {}
        approx_only = not row.get("pruned") and ap.get("macs_as_predicted") is True and ap.get("macs_left", 1) < 1
        row["passes"] = bool(row["ok"] and (row.get("pruned") or approx_only) and row.get("split_exact"))
        print(json.dumps(row))
        return row
    if a.one_tp:
        try:
            row = {**check_torch_pruning(a.zoo, a.one_tp, a.size, a.ratio), "ok": True}
        except Exception as e:
            row = {"model": a.one_tp, "ok": False, "error": f"{type(e).__name__}: {str(e)[:300]}"}
        print(json.dumps(row))
        return row
    resolve_out(a, __file__)
    if a.torch_pruning:
        try:
            import torch_pruning  # noqa: F401
        except ImportError:
            p.error("--torch-pruning needs Torch-Pruning: pip install torch-pruning==1.6.1")
    if a.models:
        models = [m for m in a.models.split(",") if m]
    elif a.zoo == "torchvision":
        import torchvision

        models = torchvision.models.list_models(module=torchvision.models)
    else:
        models = TIMM_MODELS
    a.out.mkdir(parents=True, exist_ok=True)
    log = a.out / "rows.jsonl"
    done: dict[str, dict[str, Any]] = {}
    if a.resume and log.exists():
        for line in log.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:  # a line cut short by a kill: that model runs again
                continue
            if row.get("model") in models and (row.get("tp_ok") is not None or not a.torch_pruning):
                done[row["model"]] = row
    elif log.exists():
        log.unlink()
    threads = a.threads or (max(1, (os.cpu_count() or 1) // a.jobs) if a.jobs > 1 else None)
    lock = threading.Lock()

    def one(name: str) -> dict[str, Any]:
        r = run_child(a.zoo, name, a.size, a.ratio, a.timeout, threads=threads)
        if a.torch_pruning:
            t = run_child(a.zoo, name, a.size, a.ratio, a.timeout, tool="torch_pruning", threads=threads)
            r.update(tp_ok=t["ok"], tp_macs_left=t.get("tp_macs_left"), tp_error=t.get("error"), tp_seconds=t["seconds"])
        with lock:
            with log.open("a") as f:
                f.write(json.dumps(r) + "\n")
            print(f"{name:32s} {'ok ' if r['ok'] else 'FAIL'} {'passes' if r.get('passes') else 'partial'} "
                  f"splits {r.get('split_points', '-')} exits {str(r.get('exits', '-'))[:12]} "
                  f"prunable {r.get('prunable', '-')}/{r.get('groups', '-')} "
                  f"macs left {r.get('macs_left', '-')} approx {(r.get('approx') or {}).get('macs_left', '-')} "
                  f"macs/ref {r.get('macs_vs_flop_counter', '-')} "
                  f"{'tp ' + ('ok' if r['tp_ok'] else 'FAIL') + ' ' + str(r['tp_macs_left']) if a.torch_pruning else ''} "
                  f"{r.get('error', '')}", flush=True)
        return r

    todo = [m for m in models if m not in done]
    with ThreadPoolExecutor(max_workers=a.jobs) as pool:
        for r in pool.map(one, todo):
            done[r["model"]] = r
    rows = [done[m] for m in models]
    from nestflex._io import write_json
    from nestflex._machine import machine

    pruned = [r for r in rows if r["ok"] and r.get("pruned")]
    exact = [r for r in rows if r.get("macs_vs_flop_counter") is not None and abs(r["macs_vs_flop_counter"] - 1) <= 0.01]
    approx = [r for r in rows if r["ok"] and isinstance(r.get("approx"), dict) and r["approx"].get("macs_left") is not None
              and r["approx"]["macs_left"] < 1]
    summary = {
        "benchmark": "zoo_coverage", "zoo": a.zoo, "size": a.size, "ratio": a.ratio, "machine": machine(),
        "models": len(rows), "passed": sum(r["ok"] for r in rows), "pruned": len(pruned),
        "passed_every_step": sum(bool(r.get("passes")) for r in rows),
        "with_split_points": sum(bool(r.get("split_exact")) for r in rows),
        "median_macs_left": statistics.median(r["macs_left"] for r in pruned) if pruned else None,
        "approximate": {
            "pruned": len(approx),
            "only_with_approximate": [r["model"] for r in approx if not r.get("pruned")],
            "median_macs_left": statistics.median(r["approx"]["macs_left"] for r in approx) if approx else None,
            "median_output_change": statistics.median(r["approx"]["output_change"] for r in approx) if approx else None,
        },
        "macs_within_1pct_of_flop_counter": len(exact), "rows": rows,
    }
    if a.zoo == "timm":
        summary["cifar_stem"] = sum(r.get("cifar_stem") is True for r in rows)
    if a.torch_pruning:
        both = [r for r in pruned if r.get("tp_ok")]
        summary["torch_pruning"] = {
            "version": _version("torch_pruning"), "passed": sum(bool(r.get("tp_ok")) for r in rows),
            "median_macs_left": statistics.median(r["tp_macs_left"] for r in rows if r.get("tp_ok"))
            if any(r.get("tp_ok") for r in rows) else None,
            "both": len(both),
            "median_macs_left_both": {"nestflex": statistics.median(r["macs_left"] for r in both),
                                      "torch_pruning": statistics.median(r["tp_macs_left"] for r in both)}
            if both else None,
        }
    summary["goals"] = goals(summary, rows, a.zoo)
    write_json(a.out / "summary.json", summary)
    write_table(summary, a.out / "table.md")
    write_run(a.out, __file__, argv)
    print(f"passed every step {summary['passed_every_step']}/{len(rows)}, pruned {len(pruned)}, median MACs left "
          f"{summary['median_macs_left']}, MACs within 1% of the flop counter on {len(exact)}")
    return summary


def approximate_goal(goal_rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Issue 40: with approximate=True, the median MACs left on ViT-S/DeiT-S/ConvNeXt-T within
    GOAL_MEDIAN_GAP of Torch-Pruning's (per model figures in the measured object)."""
    ours = {r["model"]: (r.get("approx") or {}).get("macs_left") for r in goal_rows}
    theirs = {r["model"]: r.get("tp_macs_left") if r.get("tp_ok") else None for r in goal_rows}
    missing = [m for m in APPROX_GOAL_MODELS if ours.get(m) is None or theirs.get(m) is None]
    measured: dict[str, Any] = {"per_model": {m: {"nestflex_approximate": ours.get(m), "torch_pruning": theirs.get(m),
                                                  "output_change": ((next(r for r in goal_rows if r["model"] == m)
                                                                     .get("approx") or {}).get("output_change")
                                                                    if m in ours else None)}
                                              for m in APPROX_GOAL_MODELS}}
    met = False
    if not missing:
        a = statistics.median(ours[m] for m in APPROX_GOAL_MODELS)
        b = statistics.median(theirs[m] for m in APPROX_GOAL_MODELS)
        measured.update(nestflex_approximate=a, torch_pruning=b, gap=round(a - b, 4))
        met = abs(a - b) <= GOAL_MEDIAN_GAP
    return {"target": f"with approximate=True, median MACs left at a 30% prune on {', '.join(APPROX_GOAL_MODELS)} "
                      f"within {GOAL_MEDIAN_GAP} of Torch-Pruning's", "measured": measured, "met": met,
            "note": (f"not measured on {missing} (not in this run, or a tool failed)" if missing else
                     "nestflex prunes whole attention heads (ViT-S/DeiT-S: 4 of their 6 kept at 30%), Torch-Pruning "
                     "head dims; "
                     "output_change is |pruned - masked| / |masked| of the approximate prune")}


def goals(summary: dict[str, Any], rows: list[dict[str, Any]], zoo: str) -> dict[str, Any]:
    """The issue's acceptance, one entry per goal (DESIGN.md's result contract)."""
    n = len(rows)
    need = round(GOAL_PASSED[zoo] * n) if n else 0
    # A model with no prunable group traces and checks, but no pruning step ran on it, so it does not
    # pass "every step" (issue 42); nor does one without a split point where head then tail is the
    # model (issue 40): the count is summary["passed_every_step"].
    unpruned = [r["model"] for r in rows if r["ok"] and not r.get("pruned")]
    only_approx = {r["model"] for r in rows if r["ok"] and not r.get("pruned")
                   and ((r.get("approx") or {}).get("macs_left") or 1) < 1}
    unsplit = [r["model"] for r in rows if r["ok"] and not r.get("split_exact")]
    barely = [f"{r['model']} ({r['macs_left']} of the MACs left)" for r in rows
              if r["ok"] and r.get("pruned") and r["macs_left"] > BARELY_PRUNED]
    failed = [r["model"] for r in rows if not r["ok"]]
    none = [m for m in unpruned if m not in only_approx]
    note = [f"traced and checked, nothing prunable even with approximate=True, not counted: {', '.join(none)}"
            ] if none else []
    note += [f"prune only with approximate=True: {', '.join(m for m in unpruned if m in only_approx)}"] \
        if only_approx & set(unpruned) else []
    note += [f"no split point with head + tail = model, not counted: {', '.join(unsplit)}"] if unsplit else []
    note += [f"failed a step: {', '.join(failed)}"] if failed else []
    note += [f"counted, barely pruned: {', '.join(barely)}"] if barely else []
    measured = sum(bool(r.get("passes")) for r in rows)
    strict = sum(bool(r.get("passes") and r.get("pruned")) for r in rows)
    note += [f"{strict} pass with an exact prune; the others prune only with approximate=True"] if strict < measured else []
    out: dict[str, Any] = {"passed": {
        "target": f">= {need}/{n} models pass every step, pruning (pruned = masked, or approximate=True where no group "
                  f"prunes exactly, MACs as predicted) and split points (head + tail = model) included "
                  f"({GOAL_PASSED[zoo]:.0%} of the list, the issue's share)",
        "measured": measured, "met": measured >= need, "note": "; ".join(note)}}
    pruned = [r for r in rows if r.get("pruned")]
    inexact = [r["model"] for r in pruned if not r.get("pruned_equals_masked")]
    out["exact_by_default"] = {
        "target": "without approximate, pruned = masked on every model pruned", "measured":
        f"{len(pruned) - len(inexact)}/{len(pruned)}", "met": not inexact,
        "note": f"pruned != masked: {inexact}" if inexact else ""}
    tp = summary.get("torch_pruning")
    if tp:
        # like with like: models each tool pruned (MACs left below 1) and that passed its own check
        tp_pruned = sum(bool(r.get("tp_ok")) and r.get("tp_macs_left") is not None and r["tp_macs_left"] < 1
                        for r in rows)
        out["above_torch_pruning"] = {
            "target": "more models pruned and passing than Torch-Pruning prunes in the same harness",
            "measured": {"nestflex": summary["pruned"], "torch_pruning": tp_pruned},
            "met": summary["pruned"] > tp_pruned,
            "note": "Torch-Pruning passes when its pruned model runs with logits of the same shape; nestflex's "
                    "check is stricter (pruned = masked, MACs as predicted)"}
        goal_rows = [r for r in rows if r["model"] in APPROX_GOAL_MODELS]
        if goal_rows:
            out["approximate_vs_torch_pruning"] = approximate_goal(goal_rows)
        both = tp["median_macs_left_both"]
        if both:
            gap = both["nestflex"] - both["torch_pruning"]
            out["median_macs_left"] = {
                "target": f"median MACs left within {GOAL_MEDIAN_GAP} of Torch-Pruning's on the {tp['both']} models "
                          "both prune", "measured": {**both, "gap": round(gap, 4)}, "met": gap <= GOAL_MEDIAN_GAP,
                "note": "a gap below 0 means nestflex removes more"}
    counted = [r for r in rows if r.get("macs_vs_flop_counter") is not None]
    off = [r["model"] for r in counted if abs(r["macs_vs_flop_counter"] - 1) > GOAL_MACS_TOLERANCE]
    out["macs_exact"] = {"target": f"MACs within {GOAL_MACS_TOLERANCE:.0%} of torch.utils.flop_counter on every "
                                   "model that traces", "measured": f"{len(counted) - len(off)}/{len(counted)}",
                         "met": not off and bool(counted), "note": f"off: {off}" if off else ""}
    return out


def write_table(summary: dict[str, Any], path: Path) -> None:
    """The per-model table in Markdown, one row per model of ``summary``."""
    tp = "torch_pruning" in summary
    head = ["model", "passes", "split points (checked exact)", "exits", "prunable / groups", "MACs left",
            "approximate: prunable, MACs left, output change", "MACs / flop counter"]
    head += ["Torch-Pruning MACs left"] if tp else []
    head += ["CIFAR stem"] if summary["zoo"] == "timm" else []
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in summary["rows"]:
        if not r["ok"]:
            passes = f"no: {(r.get('error') or '')[:90]}"
        elif not r.get("split_exact"):
            passes = "no: no split point where head + tail = model"
        elif r.get("passes"):
            passes = "yes" if r.get("pruned") else "yes, pruned with approximate=True"
        else:  # a model with nothing prunable was never pruned: it fails the prune step
            passes = "no: traced and checked, nothing prunable"
        ap = r.get("approx") or {}
        approx = (f"{ap['prunable']}, {ap['macs_left']}, {ap['output_change']}" if "macs_left" in ap
                  else f"fails: {(ap.get('error') or '-')[:60]}")
        exits = r.get("exits", "-")
        cells = [f"`{r['model']}`", passes,
                 f"{r.get('split_points', '-')} ({'yes' if r.get('split_exact') else 'no'})",
                 str(exits if isinstance(exits, int) else "0"),
                 f"{r.get('prunable', '-')} / {r.get('groups', '-')}", str(r.get("macs_left", "-")), approx,
                 str(r.get("macs_vs_flop_counter", "-"))]
        if tp:
            cells.append(str(r["tp_macs_left"]) if r.get("tp_ok") else f"fails: {(r.get('tp_error') or '')[:60]}")
        if summary["zoo"] == "timm":
            cells.append("yes" if r.get("cifar_stem") is True else "no")
        lines.append("| " + " | ".join(c.replace("|", "/").replace("\n", " ") for c in cells) + " |")
    path.write_text("\n".join(lines) + "\n")


def _version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package.replace("_", "-"))
    except PackageNotFoundError:
        return None


if __name__ == "__main__":
    main()
