"""Clustering steps 4-9: connected components of the passing pairs in rounds of mapped tasks, then each
document's label (the smallest id of its component).

The rounds are Kiveris et al.'s alternating large-star / small-star ("Connected Components in MapReduce and
Beyond", SoCC 2014), each a group-by over the slots of one node, so a task holds one slot range at a time:

* **large-star** (``ls_<r>``; records addressed to both ends of every edge, so a node sees all its neighbours):
  with m = the smallest of u and its neighbours, every neighbour v > u is joined to m; the edges (v, m) go to the
  slot of v.
* **small-star** (``ss_<r>``; records at the larger end of every edge): here the slot range's edges are reduced
  by union-find to one star per local component around its smallest id (a stronger step than small-star's per
  node, valid for any split of the edges: the stars span the same components in no more edges).

A large-star task also classifies every node of its slots: a *center* (all neighbours larger), a *leaf* (exactly
one neighbour, smaller) or *open*.  Every leaf's provisional label is its neighbour, every other node's its own id
(output ``nodes``), and the edges of the open nodes are the *residual* (output ``residual``).  Whatever the round,
the components of the graph are the components of the residual with every leaf hung on its neighbour: a leaf
cannot lie inside a path, so the non-leaf nodes of a component are connected through edges that touch an open
node, and a component's smallest id is never a leaf.  So once the residual of a round fits one task's memory,
``finish`` (one task) runs union-find over it, and ``labels`` maps every node's provisional label through it.

The DAG has a fixed number of rounds, ``ROUNDS`` large-star steps and a small-star step between each two (Airflow
has no loops).  The first round whose residual fits ``memory_mb`` ends the loop: every later round's tasks
return at once.  On duplicate graphs the residual shrinks by orders of magnitude per round (synthetic graphs of
10^6 and 10^7 documents, 2 to 64 tasks); a graph whose residual still does not
fit after ``ROUNDS`` rounds (chains of near copies millions long) stops the run with an error naming its size.

Labels are the components' smallest ids whatever the number of tasks or rounds: deterministic, as union-find in
one process gives them.

Memory: about ``BYTES_PER_EDGE`` per edge record of the slot range a round task holds; ``finish`` about
``BYTES_PER_RESIDUAL`` per residual edge, and it refuses a residual over ``memory_mb``.
"""

from __future__ import annotations

import numpy as np

import pipeline.dedup.minhash.clusters.runs as runs

ROUNDS = 3
BYTES_PER_EDGE = 160         # peak per edge record of a round (measured in large-star, plus margin)
BYTES_PER_RESIDUAL = 128
LARGE, SMALL = "ls", "ss"


def edge_schema():
    import pyarrow as pa

    return pa.schema([("key", pa.uint64()), ("other", pa.uint64())])


def node_schema():
    import pyarrow as pa

    return pa.schema([("node", pa.uint64()), ("label", pa.uint64())])


def round_steps() -> list[str]:
    """``ls_1, ss_1, ls_2, ..., ls_<ROUNDS>``: the order the DAG runs them in."""
    out = []
    for r in range(1, ROUNDS + 1):
        out.append(f"{LARGE}_{r}")
        if r < ROUNDS:
            out.append(f"{SMALL}_{r}")
    return out


# ------------------------------------------------------------------------------------------------------------
# Union-find with numpy (one slot range, or the residual)


def _compress(parent: np.ndarray) -> np.ndarray:
    while True:
        grand = parent[parent]
        if np.array_equal(grand, parent):
            return parent
        parent = grand


def union(parent: np.ndarray, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Merge the components of each (u[i], v[i]); roots are always the smallest index of their component."""
    while len(u):
        parent = _compress(parent)
        ru, rv = parent[u], parent[v]
        open_ = ru != rv
        if not open_.any():
            break
        u, v, ru, rv = u[open_], v[open_], ru[open_], rv[open_]
        np.minimum.at(parent, np.maximum(ru, rv), np.minimum(ru, rv))
    return _compress(parent)


def union_stars(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The components of the edges (a, b) as stars: (node, smallest id of its component) for every other node."""
    if not len(a):
        return np.zeros(0, np.uint64), np.zeros(0, np.uint64)
    nodes = np.unique(np.concatenate([a, b]))
    parent = union(np.arange(len(nodes), dtype=np.int64), np.searchsorted(nodes, a), np.searchsorted(nodes, b))
    moved = parent != np.arange(len(nodes))
    return nodes[moved], nodes[parent[moved]]


def star_edges(x: np.ndarray, root: np.ndarray):
    """Edges (x, root) addressed to both ends, as a large-star round reads them: (table, slots)."""
    import pyarrow as pa

    key, other = np.concatenate([x, root]), np.concatenate([root, x])
    return pa.table({"key": key, "other": other}, schema=edge_schema()), runs.slot_of(key)


def _distinct(key: np.ndarray, other: np.ndarray):
    if not len(key):
        return key, other
    order = np.lexsort((other, key))
    key, other = key[order], other[order]
    keep = np.r_[True, (key[1:] != key[:-1]) | (other[1:] != other[:-1])]
    return key[keep], other[keep]


# ------------------------------------------------------------------------------------------------------------
# Rounds


def _round_input(step: str) -> str:
    kind, r = step.split("_")
    if kind == LARGE:
        return "check" if r == "1" else f"{SMALL}_{int(r) - 1}"
    return f"{LARGE}_{r}"


def resolved_round(ctx, before: int) -> int | None:
    """The first large-star round before ``before`` whose residual fits one task (None if none did)."""
    for r in range(1, before):
        found = ctx.markers(f"{LARGE}_{r}")
        if sum(m["stats"].get("residual", 0) for m in found) <= ctx.residual_limit():
            return r
    return None


def run_round(ctx, step: str, item: dict) -> tuple[dict, dict]:
    """One task of a large-star or small-star round (a no-op once an earlier round's residual fits one task)."""
    kind, r = step.split("_")
    r = int(r)
    done_at = resolved_round(ctx, r + 1 if kind == SMALL else r)
    if done_at is not None:
        return {}, {"skipped": f"resolved after round {done_at}"}
    lo, hi = runs.task_slots(item["task"], item["of"])
    inputs = ctx.inputs(_round_input(step), "edges")
    out = {name: runs.RunWriter(ctx.rdir, step, item["task"], item["of"], name)
           for name in (("edges", "nodes", "residual") if kind == LARGE else ("edges",))}
    stats = {"edges_in": 0, "edges_out": 0, "ranges": 0}
    if kind == LARGE:
        stats.update(nodes=0, open=0, leaves=0, residual=0)
    counts = runs.slot_counts(inputs, lo, hi)
    for r0, r1 in runs.plan_ranges(counts, lo, BYTES_PER_EDGE, ctx.budget):
        t = runs.read_range(inputs, r0, r1, edge_schema())
        key, other = _distinct(t.column("key").to_numpy(), t.column("other").to_numpy())
        del t
        stats["edges_in"] += len(key)
        stats["ranges"] += 1
        if kind == LARGE:
            _large_star(key, other, out, stats)
        else:
            x, root = union_stars(key, other)
            stats["edges_out"] += len(x)
            out["edges"].write(*star_edges(x, root))
    return {name: w.written for name, w in out.items()}, stats


def _large_star(key: np.ndarray, other: np.ndarray, out: dict, stats: dict) -> None:
    import pyarrow as pa

    if not len(key):
        return
    first = np.r_[True, key[1:] != key[:-1]]
    starts = np.flatnonzero(first)
    group = np.cumsum(first) - 1
    node = key[starts]
    low = np.minimum.reduceat(other, starts)
    degree = np.diff(np.r_[starts, len(key)])
    center = low > node
    leaf = (degree == 1) & (low < node)
    open_ = ~center & ~leaf
    m = np.minimum(low, node)
    up = other > key                                   # joined to m, addressed to the larger end
    v, mv = other[up], m[group][up]
    stats["edges_out"] += len(v)
    out["edges"].write(pa.table({"key": v, "other": mv}, schema=edge_schema()), runs.slot_of(v))
    label = np.where(leaf, low, node)
    out["nodes"].write(pa.table({"node": node, "label": label}, schema=node_schema()), runs.slot_of(node))
    res = open_[group]
    out["residual"].write(pa.table({"key": key[res], "other": other[res]}, schema=edge_schema()),
                          runs.slot_of(key[res]))
    stats["nodes"] += len(node)
    stats["open"] += int(open_.sum())
    stats["leaves"] += int(leaf.sum())
    stats["residual"] += int(res.sum())


# ------------------------------------------------------------------------------------------------------------
# The end of the loop


def run_finish(ctx) -> tuple[dict, dict]:
    """Union-find over the residual of the first round that fits: ``roots`` (node, label) for every residual
    node whose label is not its own id."""
    import pyarrow as pa

    from pipeline.dedup.minhash.layout import MinhashError

    r = resolved_round(ctx, ROUNDS + 1)
    if r is None:
        sizes = [sum(m["stats"].get("residual", 0) for m in ctx.markers(f"{LARGE}_{k}")) for k in
                 range(1, ROUNDS + 1)]
        raise MinhashError(f"near-duplicate components: after {ROUNDS} rounds {sizes[-1]:,} edges are still open "
                           f"(per round: {sizes}), more than one task holds within minhash.memory_mb "
                           f"({ctx.cfg.memory_mb} MB, {ctx.residual_limit():,} edges); raise minhash.memory_mb")
    t = runs.read_range(ctx.inputs(f"{LARGE}_{r}", "residual"), 0, runs.SLOTS, edge_schema())
    x, root = union_stars(t.column("key").to_numpy(), t.column("other").to_numpy())
    order = np.argsort(x, kind="stable")
    writer = runs.RunWriter(ctx.rdir, "finish", 0, 1, "roots")
    writer.write(pa.table({"node": x[order], "label": root[order]}, schema=node_schema()),
                 np.zeros(len(x), np.int64))
    return {"roots": writer.written}, {"round": r, "residual": t.num_rows, "relabelled": len(x)}


def finish_round(ctx) -> int:
    return ctx.markers("finish", tasks=1)[0]["stats"]["round"]


def load_roots(ctx) -> tuple[np.ndarray, np.ndarray]:
    t = runs.read_range(ctx.inputs("finish", "roots", tasks=1), 0, runs.SLOTS, node_schema())
    return t.column("node").to_numpy(), t.column("label").to_numpy()


def labels_of(nodes_table, roots: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(node, component label) of the nodes of a large-star ``nodes`` output, through the residual's roots."""
    node, label = nodes_table.column("node").to_numpy(), nodes_table.column("label").to_numpy()
    rx, rroot = roots
    if len(rx):
        pos = np.minimum(np.searchsorted(rx, label), len(rx) - 1)
        hit = rx[pos] == label
        label = np.where(hit, rroot[pos], label)
    return node, label
