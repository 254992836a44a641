"""The options of ``recipes/vgg_cifar.py``: one frozen dataclass, a nested one per stage.

Each field is a command-line flag (``prune.max_drop`` is ``--prune-max-drop``) and a key of a
``--config`` file (YAML or JSON, flags override it):

    model: vgg11
    width: 0.5
    data: {kind: mnist, dir: ~/mnist}
    prune: {max_drop: 2.0, round_to: 8}     # or prune: {target: 0.3}, the budget mode; {cost: latency}
                                            # or prune: {cost: latency, target_cost: 0.5}, a time budget

``python recipes/vgg_cifar.py --print-config`` prints every option with its value.
"""

from dataclasses import dataclass

from _config import Check, ConfigError, at_least, group, option, stage_list, stages_option, validate
from nestflex.data import DATA_KINDS
from nestflex.models import list_models

#: the recipe's stages, in the order ``--stages all`` runs them
STAGES = ("baseline", "prune", "grow", "exits", "flex", "profile", "export")


@dataclass(frozen=True)
class DataConfig:
    kind: str = option("auto", "auto: CIFAR-10 if found in --data-dir, else the synthetic dataset; mnist: only "
                       "when asked", flag="--data", choices=tuple(DATA_KINDS))
    dir: str = option("data", "where CIFAR-10 (python-batch layout) or MNIST (the four IDX files, gzipped or not) "
                      "lives", flag="--data-dir")
    download: bool = option(False, "download CIFAR-10 into --data-dir if missing (MNIST is never downloaded)")
    batch_size: int = option(128, "training batch size", check=at_least(1))
    max_train_samples: int | None = option(None, "train on a seeded subset of this many samples (none: all of them)")
    val_size: int = option(5000, "validation samples held out of the train split")
    synthetic_train_size: int = option(50_000, "synthetic data only: train split size")
    synthetic_test_size: int = option(10_000, "synthetic data only: test split size")
    num_workers: int = option(0, "DataLoader worker processes", check=at_least(0))


@dataclass(frozen=True)
class PruneConfig:
    criterion: str = option("trr", "importance criterion (trr, l1, l2, random)")
    max_drop: float = option(1.0, "accuracy points the seed model may lose against the baseline",
                             check=Check(lambda v: 0 <= v < 100, "is in accuracy points, in [0, 100)"))
    target: float | None = option(None, "budget mode: prune until the seed has at most this share of the "
                                  "baseline's MACs, whatever its accuracy (none: the accuracy-goal mode, "
                                  "--prune-max-drop; docs/pruning.md#budget-mode)",
                                  check=Check(lambda v: 0 < v < 1, "is a share of the baseline's MACs in (0, 1)",
                                              "0.3 keeps 30% of the MACs; leave it out for the accuracy-goal mode"))
    target_cost: float | None = option(None, "budget mode in measured time: prune until the latency table "
                                       "predicts at most this share of the baseline's time, whatever the accuracy "
                                       "(needs --prune-cost latency; docs/pruning.md#budget-mode)",
                                       check=Check(lambda v: 0 < v < 1, "is a share of the baseline's predicted "
                                                   "time in (0, 1)", "0.5 keeps half the time"))
    cost: str = option("macs", "what a step saves: macs (NestDNN's allocation) or latency (a per-layer onnxruntime "
                       "table: steps by time saved per accuracy risked, measured fast widths, levels spaced in "
                       "time; docs/pruning.md#cost)", choices=("macs", "latency"))
    latency_table: str | None = option(None, "the latency table to plan with (`nestflex latency-table` on the "
                                       "device); none: measured here, at --prune-latency-threads, batch 1",
                                       flag="--latency-table")
    latency_threads: int = option(1, "onnxruntime threads the table is measured with when built here",
                                  check=at_least(1))
    step: float = option(0.25, "share of channels the most tolerant layer loses per step")
    epochs_per_step: int = option(1, "retraining epochs per step", check=at_least(1))
    max_steps: int = option(10, "at most this many kept steps (docs/pruning.md#noise says why 10)",
                            check=at_least(1))
    recover_epochs: int = option(1, "extra retraining epochs a step that misses the goal gets before it counts "
                                 "as broken", check=at_least(0))
    retry_budget: int = option(2, "broken steps the roadmap retries in all; the next ends it (bounds the stage's "
                               "time: docs/pruning.md#time; -1: no bound)",
                               check=Check(lambda v: v >= -1, "is a count of tries (-1: no bound)"))
    decision: str = option("threshold", "how the accuracy-goal mode judges a step: threshold (the step's "
                           "accuracy against the goal) or paired (a one-sided bound on its paired difference to "
                           "the start model on the same validation images; docs/pruning.md#the-paired-rule-opt-in)",
                           choices=("threshold", "paired"))
    confidence: float = option(0.9, "with --prune-decision paired: the bound's confidence (a step exactly at the "
                               "goal is rejected at most 1 - this of the time)",
                               check=Check(lambda v: 0.5 < v < 1, "is a confidence in (0.5, 1)", "0.9"))
    confirm: float | None = option(None, "confirm the seed with this confidence: once the roadmap ends, the "
                                   "fine-tuned seed is kept only when its paired lower bound is within the goal, "
                                   "else the step before it is fine-tuned and judged (none: no check; "
                                   "docs/pruning.md#confirming-the-seed)",
                                   check=Check(lambda v: 0.5 < v < 1, "is a confidence in (0.5, 1)", "0.9"))
    round_to: int = option(1, "keep channel counts at multiples of this (8, 16: SIMD-friendly widths; 1: any)",
                           check=at_least(1))
    snap: str = option("nearest", "how a group's schedule becomes a width it may take (--prune-round-to's "
                       "multiples, --prune-cost latency's fast widths): nearest, or up (only once the schedule "
                       "reaches it; docs/pruning.md#cost)", choices=("nearest", "up"))
    step_cap: float | None = option(None, "with --prune-cost latency: a step cuts at most this multiple of its "
                                    "share of the cost; groups past it wait for the next step (none: no cap; "
                                    "docs/pruning.md#cost)",
                                    check=Check(lambda v: v >= 1, "is a multiple of the step's share, >= 1",
                                                "2 lets a step cut at most twice its share"))
    finetune_epochs: int = option(2, "epochs of fine-tuning for the seed once the roadmap ends (0: none)",
                                  check=at_least(0))
    lr: float = option(0.02, "peak learning rate of each retraining")
    triplets: int = option(1000, "TRR triplets per ranking")


@dataclass(frozen=True)
class GrowConfig:
    levels: int = option(5, "descendants K (seed and vanilla included), evenly spaced in MACs on the roadmap",
                         check=at_least(2))
    epochs_per_level: int = option(1, "training epochs per grown level", check=at_least(1))
    lr: float = option(0.02, "peak learning rate of each level")
    init: str = option("footprint", "where grown filters start (their footprint's values by default)",
                       choices=("footprint", "vanilla", "random"))
    train_samples: int | None = option(None, "train on a seeded subset of this many samples (none: all of them)")
    latency_repeats: int = option(10, "timed runs per latency", check=at_least(1))


@dataclass(frozen=True)
class ExitsConfig:
    positions: str = option("0.15,0.3,0.45,0.6,0.75,0.9", "comma list of MACs fractions in (0, 1) and/or split "
                            "point names (SPINN default)")
    head: str = option("sdn", "exit head (nestflex.exits.list_heads())")
    mode: str = option("exits_only", "train the heads on the frozen baseline, or fine-tune everything jointly",
                       choices=("exits_only", "joint"))
    epochs: int = option(3, "training epochs", check=at_least(1))
    lr: float = option(0.05, "peak learning rate")
    confidence: str = option("max_prob", "confidence measure (nestflex.exits.list_confidences())")
    fallback: str = option("most_confident", "who answers a sample no early exit took (SPINN: the most "
                           "confident exit)", choices=("most_confident", "final"))


@dataclass(frozen=True)
class FlexConfig:
    positions: str = option("all", "candidate exit locations: `all` (after every layer; the plan picks) or MACs "
                            "fractions and/or split point names")
    exits_per_location: int = option(3, "M over-parameterised exits per location (exit k takes the top "
                                     "ceil(kN/M) filters)", check=at_least(1))
    base_width: int = option(8, "filters of each exit's first block", check=at_least(1))
    # the exits stage's training budget by default (all training images, 3 epochs): FlexDNN's conv heads need
    # at least as much training as SPINN's pooled heads to be compared fairly (docs/flexdnn.md, Measured)
    epochs: int = option(3, "joint training epochs of the exits", check=at_least(1))
    train_samples: int | None = option(None, "train the exits on a seeded subset of this many training samples "
                                       "(none: all of them)", check=at_least(1, hint="leave it out for all training images"))
    val_samples: int = option(2000, "validation samples for ranking, pruning and the plan", check=at_least(1))
    calibration_samples: int = option(
        2000, "further validation samples, disjoint from those, that fit the shipped thresholds (0: fit them on "
        "the planning samples)", check=Check(lambda v: v == 0 or v >= 5, "must be 0 (thresholds on the planning "
                                             "images) or >= 5 (the cross-validation folds)"))
    rate_tolerance: float = option(0.02, "exit rate an exit may lose while its layers and filters are pruned",
                                   check=Check(lambda v: 0 <= v < 1, "is a share of samples in [0, 1)"))


@dataclass(frozen=True)
class ProfileConfig:
    samples: int = option(1000, "validation samples used per <split, bitwidth> and per layer precision",
                          check=at_least(1))


@dataclass(frozen=True)
class PrecisionConfig:
    budget: float = option(1.0, "accuracy drop (points) the per-layer precision assignment may cost",
                           check=at_least(0, " accuracy points"))
    calibration: int = option(256, "validation samples, held out of the accuracy ones, that calibrate int8",
                              check=at_least(1))
    threads: int = option(1, "torch threads while timing layer precisions (0: keep torch's setting)",
                          check=at_least(0))



@dataclass(frozen=True)
class VggCifarConfig:
    """Every option of the recipe; ``VggCifarConfig()`` is the default run."""

    model: str = option("vgg16", f"one of {', '.join(list_models())} or timm:<name>")
    width: float = option(0.25, "channel multiplier (1.0 = the paper's VGG)",
                          check=Check(lambda v: v > 0, "must be > 0"))
    epochs: int = option(6, "baseline training epochs", check=at_least(1))
    lr: float = option(0.05, "baseline peak learning rate")
    seed: int = option(0, "seed of the data split, subsets and every stage's training")
    accelerator: str = option("auto", "Lightning accelerator: auto, cpu, gpu, ...")
    devices: str = option("1", "Lightning devices")
    out: str = option("runs/vgg_cifar", "output directory")
    stages: str = stages_option(STAGES)
    data: DataConfig = group(DataConfig, "", "data")
    prune: PruneConfig = group(PruneConfig, "prune", "prune stage (FilterPruning, NestDNN)")
    grow: GrowConfig = group(GrowConfig, "grow", "grow stage (FreezeAndGrow, NestDNN)")
    exits: ExitsConfig = group(ExitsConfig, "exit", "exits stage (MultiExitClassifier, SPINN/SDN)")
    flex: FlexConfig = group(FlexConfig, "flex", "flex stage (FlexDNNExits, FlexDNN)")
    profile: ProfileConfig = group(ProfileConfig, "profile", "profile stage: split quantisation")
    precision: PrecisionConfig = group(PrecisionConfig, "precision", "profile stage: per-layer precision")

    def __post_init__(self) -> None:
        validate(self)
        check_budget(self.prune)

    @property
    def stage_list(self) -> list[str]:
        return stage_list(self.stages, STAGES)


def check_budget(p: PruneConfig) -> None:
    """The options no single check sees: one budget at most, and a time budget needs the table's time."""
    if p.target is not None and p.target_cost is not None:
        raise ConfigError(f"--prune-target and --prune-target-cost are two budgets, got {p.target!r} and "
                          f"{p.target_cost!r}. HINT: pass one: MACs (--prune-target) or time (--prune-target-cost)")
    if p.step_cap is not None and p.cost != "latency":
        raise ConfigError(f"--prune-step-cap {p.step_cap!r} caps a step in the latency table's time, got --prune-cost "
                          f"{p.cost}. HINT: add --prune-cost latency, or leave --prune-step-cap out (MACs fall channel "
                          f"by channel and need no cap)")
    if p.decision == "paired" and (p.target is not None or p.target_cost is not None):
        flag = "--prune-target" if p.target is not None else "--prune-target-cost"
        raise ConfigError(f"--prune-decision paired judges steps against the accuracy goal, got {flag} "
                          f"{p.target if p.target is not None else p.target_cost!r} (the budget mode judges none). "
                          f"HINT: leave {flag} out for the accuracy-goal mode, or --prune-decision out")
    if p.confirm is not None and (p.target is not None or p.target_cost is not None):
        flag = "--prune-target" if p.target is not None else "--prune-target-cost"
        raise ConfigError(f"--prune-confirm {p.confirm!r} checks the seed against the accuracy goal, got {flag} "
                          f"{p.target if p.target is not None else p.target_cost!r} (the budget mode has none). "
                          f"HINT: leave {flag} out for the accuracy-goal mode, or --prune-confirm out")
    if p.target_cost is not None and p.cost != "latency":
        raise ConfigError(f"--prune-target-cost {p.target_cost!r} is a share of the time the latency table "
                          f"predicts, got --prune-cost {p.cost}. HINT: add --prune-cost latency (and --latency-table "
                          f"PATH for a table built on the device), or use --prune-target for a MACs budget")
