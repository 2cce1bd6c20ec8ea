"""The network and how it is split over ranks.

``config`` (the architecture: ``ModelConfig``, presets, RoPE tables), ``model`` (one process's LLaMA-style decoder),
``tp_layers`` (Megatron's column/row split written by hand) and ``parallelize`` (tensor parallel applied to a plain
model in one step), ``shard_init`` (initial weights drawn per parameter and per shard), ``layout`` (the one
description of a TP x DP layout), ``parallel`` (rank groups, parameter shards, the TP-aware gradient norm),
``parallel_setup`` (one rank's model, optimizer and save targets) and ``memory_plan`` (bytes per device of a layout,
refused before any compile). ``config``, ``layout`` and ``memory_plan`` import no MindSpore.
"""
