"""The options of ``recipes/progressive_cifar.py``: one frozen dataclass (flags, ``--config`` keys).

    python recipes/progressive_cifar.py --print-config     # every option with its value
"""

from dataclasses import dataclass

from _config import Check, at_least, group, option, stage_list, stages_option, validate
from nestflex.exits import list_confidences, list_heads

#: the recipe's stages, in the order ``--stages all`` runs them
STAGES = ("train", "exits")



@dataclass(frozen=True)
class ProgressiveDataConfig:
    kind: str = option("auto", "auto: CIFAR-10 if found in --data-dir, else the synthetic dataset", flag="--data",
                       choices=("auto", "cifar10", "synthetic"))
    dir: str = option("data", "where CIFAR-10 lives (python-batch layout)", flag="--data-dir")
    download: bool = option(False, "download CIFAR-10 into --data-dir if missing")
    batch_size: int = option(128, "training batch size", check=at_least(1))
    max_train_samples: int = option(10_000, "train on a seeded subset of this many images (0: all)",
                                    check=at_least(0, hint="0 trains on every image"))
    val_size: int = option(5000, "validation samples held out of the train split")
    synthetic_train_size: int = option(50_000, "synthetic data only: train split size")
    synthetic_test_size: int = option(10_000, "synthetic data only: test split size")
    num_workers: int = option(0, "DataLoader worker processes", check=at_least(0))


@dataclass(frozen=True)
class ProgressiveExitsConfig:
    positions: str = option("0.15,0.3,0.45,0.6,0.75,0.9",
                            "exit positions: MACs fractions in (0, 1) and/or split point names")
    head: str = option("sdn", f"exit head: {', '.join(list_heads())}")
    confidence: str = option("max_prob", f"confidence measure: {', '.join(list_confidences())}")
    fallback: str = option("most_confident", "who answers a sample no early exit took (SPINN: the most confident "
                           "exit)", choices=("most_confident", "final"))


@dataclass(frozen=True)
class ProgressiveCifarConfig:
    """Every option of the recipe; ``ProgressiveCifarConfig()`` is the default run."""

    model: str = option("resnet56", "backbone (any nestflex or timm:<name> model)")
    width: float = option(0.5, "channel multiplier (1.0 = the paper's ResNet-56)",
                          check=Check(lambda v: v > 0, "must be > 0"))
    epochs: int = option(5, "joint training epochs", check=at_least(1))
    lr: float = option(0.05, "peak learning rate")
    seed: int = option(0, "seed of the data split, the subset and the training")
    accelerator: str = option("auto", "Lightning accelerator: auto, cpu, gpu, ...")
    devices: str = option("1", "Lightning devices")
    out: str = option("runs/progressive_cifar", "output directory")
    stages: str = stages_option(STAGES)
    data: ProgressiveDataConfig = group(ProgressiveDataConfig, "", "data")
    exits: ProgressiveExitsConfig = group(ProgressiveExitsConfig, "", "exits (SPINN/SDN)")

    def __post_init__(self) -> None:
        validate(self)

    @property
    def stage_list(self) -> list[str]:
        return stage_list(self.stages, STAGES)
