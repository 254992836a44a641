"""FilterPruning's argument checks, kept apart from the callback's logic: each names the argument,
the value and the fix."""

from __future__ import annotations

from typing import Any

from nestflex.errors import PruningError
from nestflex.pruning.step import SNAPS

ALLOCATIONS = ("sensitivity", "uniform")
MODES = ("goal", "max_drop", "target_macs", "target_cost")
DECISIONS = ("threshold", "paired")


def check_arguments(*, goal: Any, max_drop: Any, target_macs: Any, target_cost: Any, epochs_per_step: Any,
                    step: Any, sensitivity_drop: Any, max_steps: Any, recover_epochs: Any, finetune_epochs: Any,
                    backoff: Any, retry_budget: Any, min_channels: Any, round_to: Any, eval_batches: Any,
                    sensitivity_batches: Any, snap: Any, allocation: Any, decision: Any, confidence: Any,
                    approximate: Any, step_cap: Any, cost: Any, confirm: Any) -> None:
    """Raise :class:`~nestflex.errors.PruningError` on the first bad argument of ``FilterPruning``."""
    given = dict(zip(MODES, (goal, max_drop, target_macs, target_cost)))
    if sum(v is not None for v in given.values()) != 1:
        raise PruningError(
            f"pass exactly one of `goal`, `max_drop`, `target_macs` and `target_cost`, got "
            f"{', '.join(f'{k}={v!r}' for k, v in given.items())}. HINT: `goal` or `max_drop` prune while the "
            f"accuracy holds (NestDNN); `target_macs` (`target_cost`) prunes to a share of the MACs (of the "
            f"cost under `cost`) whatever the accuracy"
        )
    if goal is not None and not 0.0 < goal <= 1.0:
        raise PruningError(f"`goal` is an accuracy in (0, 1], got {goal!r}. HINT: 0.9 means 90%")
    if max_drop is not None and not 0.0 <= max_drop < 1.0:
        raise PruningError(f"`max_drop` is an accuracy difference in [0, 1), got {max_drop!r}. HINT: 0.01 is one point")
    checks = (
        ("epochs_per_step", epochs_per_step, isinstance(epochs_per_step, int) and epochs_per_step >= 1, "an int >= 1"),
        ("step", step, isinstance(step, (int, float)) and 0.0 < step < 1.0, "in (0, 1)"),
        ("sensitivity_drop", sensitivity_drop, 0.0 <= sensitivity_drop < 1.0, "in [0, 1)"),
        ("max_steps", max_steps, max_steps is None or (isinstance(max_steps, int) and max_steps >= 1), "None or an int >= 1"),
        ("recover_epochs", recover_epochs, isinstance(recover_epochs, int) and recover_epochs >= 0, "an int >= 0"),
        ("finetune_epochs", finetune_epochs, isinstance(finetune_epochs, int) and finetune_epochs >= 0, "an int >= 0"),
        ("backoff", backoff, isinstance(backoff, int) and backoff >= 0, "an int >= 0"),
        ("retry_budget", retry_budget, retry_budget is None or (isinstance(retry_budget, int) and retry_budget >= 0),
         "None or an int >= 0"),
        ("min_channels", min_channels, isinstance(min_channels, int) and min_channels >= 1, "an int >= 1"),
        ("round_to", round_to, isinstance(round_to, int) and round_to >= 1, "an int >= 1"),
        ("eval_batches", eval_batches, eval_batches is None or (isinstance(eval_batches, int) and eval_batches >= 1), "None or an int >= 1"),
        ("sensitivity_batches", sensitivity_batches, sensitivity_batches is None or (isinstance(sensitivity_batches, int) and sensitivity_batches >= 1), "None or an int >= 1"),
    )
    for arg, value, ok, valid in checks:
        if not ok:
            raise PruningError(f"`{arg}` must be {valid}, got {value!r}")
    if snap not in SNAPS:
        raise PruningError(f"`snap` must be one of {SNAPS}, got {snap!r}. HINT: 'up' drops a group to a faster "
                           f"width only once its schedule reaches it")
    if allocation not in ALLOCATIONS:
        raise PruningError(f"`allocation` must be one of {ALLOCATIONS}, got {allocation!r}")
    if decision not in DECISIONS:
        raise PruningError(f"`decision` must be one of {DECISIONS}, got {decision!r}. HINT: 'paired' keeps a "
                           f"step unless it is confidently below the goal")
    if decision == "paired" and (target_macs is not None or target_cost is not None):
        arg = "target_macs" if target_macs is not None else "target_cost"
        raise PruningError(f"`decision`='paired' judges steps against an accuracy goal; the budget mode "
                           f"(`{arg}`) judges none. HINT: pass `goal` or `max_drop`, or leave `decision`")
    if not (isinstance(confidence, (int, float)) and not isinstance(confidence, bool) and 0.5 < confidence < 1.0):
        raise PruningError(f"`confidence` must be in (0.5, 1), got {confidence!r}. HINT: 0.9 rejects a step whose "
                           f"true accuracy is exactly at the goal about 10% of the time")
    if not isinstance(approximate, bool):
        raise PruningError(f"`approximate` must be True or False, got {approximate!r}. HINT: True also prunes "
                           f"LayerNorm-normalised streams (ViT, ConvNeXt), approximately")
    if step_cap is not None and (cost is None or isinstance(step_cap, bool)
                                 or not isinstance(step_cap, (int, float)) or not step_cap >= 1):
        raise PruningError(f"`step_cap` must be None or a number >= 1 with a `cost` model, got step_cap="
                           f"{step_cap!r}, cost={cost!r}. HINT: 2.0 lets a step cut at most twice its share of "
                           f"the cost; without `cost` widths fall channel by channel and need no cap")
    if confirm is not None and not (isinstance(confirm, (int, float)) and not isinstance(confirm, bool)
                                    and 0.5 < confirm < 1.0):
        raise PruningError(f"`confirm` must be None or a confidence in (0.5, 1), got {confirm!r}. HINT: 0.9 keeps the "
                           f"seed only when the validation split puts it within the goal with 90% confidence")
    if confirm is not None and max_drop == 0:
        raise PruningError("`confirm` needs room under the start to be confident in, got max_drop=0: a seed identical to "
                           "the start model would fail it. HINT: a `max_drop` > 0, or leave `confirm` out")
    if confirm is not None and (target_macs is not None or target_cost is not None):
        arg = "target_macs" if target_macs is not None else "target_cost"
        raise PruningError(f"`confirm` checks the seed against the accuracy goal; the budget mode (`{arg}`) has "
                           f"none. HINT: pass `goal` or `max_drop`, or leave `confirm` out")


def check_resumed_mode(state: dict[str, Any], mine: dict[str, Any]) -> None:
    """A checkpoint's FilterPruning state resumes only under the mode and targets it ran with."""
    saved = {"mode": state.get("mode", "accuracy"), "target_macs": state.get("target_macs"),
             "target_cost": state.get("target_cost")}  # checkpoints before target_cost lack it
    if saved != mine:
        # name the targets either side set (target_macs when neither does)
        args = [k for k in ("target_macs", "target_cost") if saved[k] is not None or mine[k] is not None]
        said = {side: ", ".join(f"{k}={d[k]!r}" for k in args or ["target_macs"]) for side, d in
                (("saved", saved), ("mine", mine))}
        raise PruningError(
            f"the checkpoint's FilterPruning ran in mode {saved['mode']!r} ({said['saved']}), this one in "
            f"{mine['mode']!r} ({said['mine']}). HINT: resume with the arguments the run started with"
        )
