"""The model architecture with no MindSpore import: ``ModelConfig``, the presets, the closed-form parameter count,
the RoPE tables and the splits tensor parallel needs.

Kept apart from ``model.py`` so job validation, the memory plan and DAG-side code (the Airflow venv) can check an
architecture without importing MindSpore.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING

if TYPE_CHECKING:                # numpy loads with the model code, not with the config every task imports
    import numpy as np

ROPE_SCALING_TYPES = ("none", "ntk", "linear")


def llama_ffn_hidden(dim: int, multiple_of: int, ffn_dim_multiplier: float | None = None) -> int:
    """SwiGLU hidden size as in Meta's LLaMA: 2/3 of 4*dim (same FLOPs as a 4*dim GELU MLP), rounded up."""
    hidden = int(2 * (4 * dim) / 3)
    if ffn_dim_multiplier:
        hidden = int(ffn_dim_multiplier * hidden)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


@dataclass
class ModelConfig:
    """Architecture hyper-parameters. ``ffn_hidden=0`` means "derive llama-style from ``multiple_of``"."""

    vocab_size: int = 32000
    dim: int = 768
    n_layers: int = 12
    n_heads: int = 12
    n_kv_heads: int = 0  # 0 -> n_heads (plain MHA); < n_heads -> grouped-query attention
    ffn_hidden: int = 0
    multiple_of: int = 256
    ffn_dim_multiplier: float | None = None
    max_seq_len: int = 2048
    rope_theta: float = 10000.0
    rope_scaling_type: str = "none"
    rope_scaling_factor: float = 1.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = False
    recompute: bool = False
    init_std: float = 0.02
    pad_id: int = -100  # label id excluded from the loss; -100 (never a real token) disables padding
    eod_id: int = -1  # >= 0: a token attends only within its document, which ends at this id; -1: causal only
    reset_positions: bool = False  # RoPE positions count from each document's start (needs eod_id >= 0)
    max_documents_per_row: int = 128  # flash attention's variable-length form: boundaries kept per row (Ascend)

    def __post_init__(self) -> None:
        def bad(name: str, why: str) -> ValueError:
            return ValueError(f"ModelConfig.{name}={getattr(self, name)!r}: {why}")

        for name in ("vocab_size", "dim", "n_layers", "n_heads", "max_seq_len", "multiple_of"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise bad(name, "must be a positive integer")
        for name in ("n_kv_heads", "ffn_hidden"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise bad(name, "must be a non-negative integer (0 = derive)")
        if self.n_kv_heads == 0:
            self.n_kv_heads = self.n_heads
        if self.dim % self.n_heads:
            raise bad("dim", f"must be divisible by n_heads={self.n_heads}")
        if (self.dim // self.n_heads) % 2:
            raise bad("n_heads", "head_dim = dim // n_heads must be even for RoPE")
        if self.n_kv_heads > self.n_heads or self.n_heads % self.n_kv_heads:
            raise bad("n_kv_heads", f"must divide n_heads={self.n_heads}")
        if self.ffn_hidden == 0:
            self.ffn_hidden = llama_ffn_hidden(self.dim, self.multiple_of, self.ffn_dim_multiplier)
        if not self.rope_theta > 0:
            raise bad("rope_theta", "must be > 0")
        if self.rope_scaling_type not in ROPE_SCALING_TYPES:
            raise bad("rope_scaling_type", f"must be one of {ROPE_SCALING_TYPES}")
        if not self.rope_scaling_factor >= 1.0:
            raise bad("rope_scaling_factor", "must be >= 1.0")
        if not 0 < self.norm_eps < 1:
            raise bad("norm_eps", "must be in (0, 1)")
        if not self.init_std > 0:
            raise bad("init_std", "must be > 0")
        if not isinstance(self.pad_id, int) or self.pad_id >= self.vocab_size:
            raise bad("pad_id", f"must be an int < vocab_size={self.vocab_size} (negative = no padding)")
        if (not isinstance(self.eod_id, int) or isinstance(self.eod_id, bool)
                or not -1 <= self.eod_id < self.vocab_size):
            raise bad("eod_id", f"must be -1 (causal mask only) or a token id < vocab_size={self.vocab_size}")
        if not isinstance(self.reset_positions, bool):
            raise bad("reset_positions", "must be true or false")
        if self.reset_positions and self.eod_id < 0:
            raise bad("reset_positions", "needs document boundaries: eod_id >= 0 (train.document_attention on a "
                      "corpus whose manifest names its eos_id)")
        if (not isinstance(self.max_documents_per_row, int) or isinstance(self.max_documents_per_row, bool)
                or self.max_documents_per_row < 1):
            raise bad("max_documents_per_row", "must be a positive integer")

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @classmethod
    def from_preset(cls, name: str, **overrides) -> ModelConfig:
        """Preset + overrides; unknown override keys raise ValueError naming them."""
        if name not in PRESETS:
            raise ValueError(f"ModelConfig preset={name!r}: unknown, choose from {sorted(PRESETS)}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise ValueError(f"ModelConfig.{unknown[0]}: unknown field (known: {sorted(known)})")
        base = dict(PRESETS[name])
        if "multiple_of" in overrides or "dim" in overrides or "ffn_dim_multiplier" in overrides:
            base.pop("ffn_hidden", None)  # let it be re-derived unless overridden explicitly
        base.update(overrides)
        return cls(**base)

    def to_dict(self) -> dict:
        return asdict(self)

    def num_params(self) -> int:
        """Closed-form parameter count; equals the built Cell's count (checked in tests)."""
        d, hd = self.dim, self.head_dim
        attn = d * self.n_heads * hd + 2 * d * self.n_kv_heads * hd + self.n_heads * hd * d
        mlp = 3 * d * self.ffn_hidden
        per_layer = attn + mlp + 2 * d  # + attention_norm, ffn_norm
        emb = self.vocab_size * d
        head = 0 if self.tie_embeddings else self.vocab_size * d
        return emb + self.n_layers * per_layer + d + head


# Sizes follow published LLaMA-family models (125m: GPT-3 small shape; 1b: TinyLlama-1.1B; 7b/13b: LLaMA-1/2;
# 70b: LLaMA-2-70B with GQA). "debug" is ~2M params so GRAPH compile + a few steps fit a 2-core CPU.
PRESETS: dict[str, dict] = {
    "debug": dict(vocab_size=4096, dim=128, n_layers=4, n_heads=4, n_kv_heads=2, multiple_of=32, max_seq_len=256),
    "125m": dict(vocab_size=32000, dim=768, n_layers=12, n_heads=12, n_kv_heads=12, max_seq_len=2048),
    "1b": dict(vocab_size=32000, dim=2048, n_layers=22, n_heads=32, n_kv_heads=4, ffn_hidden=5632, max_seq_len=2048),
    "7b": dict(vocab_size=32000, dim=4096, n_layers=32, n_heads=32, n_kv_heads=32, ffn_hidden=11008,
               max_seq_len=4096),
    "13b": dict(vocab_size=32000, dim=5120, n_layers=40, n_heads=40, n_kv_heads=40, ffn_hidden=13824,
                max_seq_len=4096),
    "70b": dict(vocab_size=32000, dim=8192, n_layers=80, n_heads=64, n_kv_heads=8, ffn_hidden=28672,
                max_seq_len=4096),
}


def rope_tables(cfg: ModelConfig) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin tables ``[max_seq_len, head_dim]`` (half-split layout, matching ``rotate_half``).

    NTK-aware scaling raises the base: ``theta * factor ** (d / (d - 2))`` (keeps high frequencies, stretches low
    ones); linear scaling (position interpolation) divides positions by ``factor``.
    """
    import numpy as np

    d = cfg.head_dim
    theta = cfg.rope_theta
    pos = np.arange(cfg.max_seq_len, dtype=np.float64)
    if cfg.rope_scaling_type == "ntk":
        theta = theta * cfg.rope_scaling_factor ** (d / (d - 2))
    elif cfg.rope_scaling_type == "linear":
        pos = pos / cfg.rope_scaling_factor
    inv_freq = 1.0 / theta ** (np.arange(0, d, 2, dtype=np.float64) / d)
    ang = np.outer(pos, inv_freq)
    ang = np.concatenate([ang, ang], axis=-1)
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


def causal_mask(n: int) -> np.ndarray:
    """Additive mask: 0 on/below the diagonal, -1e9 above (finite, so fp32 softmax never sees inf - inf)."""
    import numpy as np

    return np.triu(np.full((n, n), -1e9, dtype=np.float32), k=1)


def check_layout(cfg: ModelConfig, tp: int, where: str = "TrainJob.tensor_parallel") -> None:
    """The head/vocab/FFN splits tensor parallel needs; the error names the field."""
    if tp < 1:
        raise ValueError(f"{where}={tp}: must be >= 1")
    for name, n in (("n_heads", cfg.n_heads), ("n_kv_heads", cfg.n_kv_heads), ("vocab_size", cfg.vocab_size),
                    ("ffn_hidden", cfg.ffn_hidden)):
        if n % tp:
            raise ValueError(f"{where}={tp}: must divide ModelConfig.{name}={n}")
