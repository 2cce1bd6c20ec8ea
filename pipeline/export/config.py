"""Settings of the export task at the end of the ``pretrain`` DAG (the ``mindloom export`` CLI takes the same)."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.configkit import ConfigError, _f

FORMATS = ("mindformers", "hf")
DEVICES = ("", "CPU", "GPU", "Ascend")


@dataclass
class ExportConfig:
    """Which client formats the last stage's final checkpoint is written in (``<stage dir>/export/<format>``)."""

    formats: list[str] = _f(factory=list, desc="Client formats the pretrain DAG's export task writes after the "
                            "last stage: mindformers (1.9: weights-only .ckpt + model and pretraining YAML; 2.x: "
                            "model.safetensors + Hugging Face config folder, and a Megatron-dataset pretraining YAML "
                            "when the corpus has Megatron files), hf (safetensors + config.json + tokenizer for "
                            "transformers). Empty: no export task.")
    device: str = _f("", desc="Device the mindformers model YAML is written for (use_flash_attention on Ascend "
                     "only); empty: the device the stage trained on.", choices=DEVICES)

    def __post_init__(self) -> None:
        for i, f in enumerate(self.formats):
            if f not in FORMATS:
                raise ConfigError(f"export.formats[{i}]: {f!r} is not one of {', '.join(FORMATS)}")
        if len(set(self.formats)) != len(self.formats):
            raise ConfigError(f"export.formats: duplicate format in {self.formats}")
