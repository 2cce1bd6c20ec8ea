"""The optimizer side of a step.

``adamw`` (bias-corrected AdamW, ZeRO-1 sharded moments, the distributed optimizer), ``optim`` (optimizer, LR
schedule, loss scaling, the functional training step with gradient accumulation) and ``precision`` (which precision
runs on which device in which mode, as data; no MindSpore import).
"""
