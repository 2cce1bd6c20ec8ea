"""The ``ablation:`` section: which corpus variants (arms) a data ablation trains and how it scores them.

An arm is a set of dotted overrides of the deployment's config (``{"quality.enabled": false}``); every arm reads
the same documents (the references held out first), builds its corpus through the same chain, and trains the same
proxy model on the same tokens per domain (``mixture.matched``), so the arms differ only in what the chain did.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pipeline.configkit import ConfigError, _f

ARM_NAME = re.compile(r"^[a-z][a-z0-9_]{0,39}$")
RAW = {"dedup.exact": False, "minhash.enabled": False, "quality.enabled": False}


@dataclass
class AblationConfig:
    arms: dict = _f(factory=lambda: {"raw": dict(RAW), "shipped": {}},
                    desc="Arm name -> dotted config overrides ({} : the config as it is). The first arm is the "
                         "baseline every other arm is compared with. Default: raw (exact dedup, near dedup and "
                         "quality filters off) and shipped.")
    seeds: int = _f(4, desc="Training seeds per arm (initial weights and data order); differences are paired "
                            "by seed.", ge=1, le=64)
    aa: bool = _f(True, desc="Train the baseline arm a second time with other seeds: the A/A pair whose spread is "
                             "the noise floor every difference is read against.")
    steps: int = _f(200, desc="Optimizer steps of each proxy training run.", ge=1)
    total_tokens: int = _f(0, desc="Training tokens of every arm's mixture (mixture.total_tokens, matched); 0: "
                                   "steps x train.batch_size x pack.seq_len.", ge=0)
    reference_docs: int = _f(30, desc="Reference documents held out per domain (fewer where a domain has fewer "
                                      "than twice that many), before any arm reads the sources.", ge=1)
    reference_max_bytes: int = _f(8192, desc="Each reference document is scored on at most this many UTF-8 bytes "
                                             "(its start), so no single long document dominates a domain.", ge=256)
    piece_bytes: int = _f(2048, desc="Training documents are cut at line ends into pieces of at most this many "
                                     "UTF-8 bytes before any arm reads them, so every arm's matched mixture meets "
                                     "each domain's tokens within a few percent (it selects whole documents: one "
                                     "whole book against a domain's target is all or nothing). Every arm's chain "
                                     "then dedups and filters pieces. 0: whole documents.", ge=0)
    control_share: float = _f(0.25, desc="The positive control: this share of the training documents is planted "
                              "with junk the chain should remove (exact copies, lines repeated, words scrambled) "
                              "and the baseline and the second arm are trained on that corpus too; their "
                              "difference must clear the noise floor, else every verdict is inconclusive. 0: no "
                              "control.", ge=0.0, le=0.9)
    cloze_items: int = _f(4, desc="Last-word cloze items per reference document (4-way: the true last word of a "
                                  "line against three of the domain's other last words with as many letters; chance "
                                  "25 %). 0: bits per byte only.", ge=0)
    primary: str = _f("", desc="The domain whose bits per byte is the primary number, named before the run "
                               "(empty: all domains pooled).")
    replicates: int = _f(2000, desc="Bootstrap draws per interval.", ge=100)

    def __post_init__(self) -> None:
        if not isinstance(self.arms, dict) or len(self.arms) < 2:
            raise ConfigError("ablation.arms: at least two arms (a baseline and one to compare), e.g. "
                              "{raw: {quality.enabled: false}, shipped: {}}")
        for name, overrides in self.arms.items():
            if not isinstance(name, str) or not ARM_NAME.match(name):
                raise ConfigError(f"ablation.arms.{name}: an arm name is 1-40 lowercase letters, digits or _, "
                                  f"starting with a letter")
            if name.endswith(("_aa", "_control")):
                raise ConfigError(f"ablation.arms.{name}: names ending in _aa or _control are the A/A and control "
                                  f"runs the ablation adds itself")
            if not isinstance(overrides, dict):
                raise ConfigError(f"ablation.arms.{name}: expected a map of dotted config fields to values, got "
                                  f"{overrides!r}")
            for key in overrides:
                if not isinstance(key, str) or key.split(".")[0] in ("sources", "data_root", "ablation", "train",
                                                                     "mixture", "seed"):
                    raise ConfigError(f"ablation.arms.{name}.{key}: an arm may change what the chain does to the "
                                      f"documents, not the sources, outputs, mixture, seed or training (those are "
                                      f"the same for every arm)")

    def baseline(self) -> str:
        return next(iter(self.arms))

    def control_arms(self) -> list[str]:
        """The control pair, trained on the junk-planted documents: the baseline's and the second arm's chain."""
        return [f"{a}_control" for a in list(self.arms)[:2]] if self.control_share > 0 else []
