"""MinHash stage 3 as mapped steps: resumable between rounds, components equal to union-find, a clear stop.

The graphs are the synthetic duplicate graphs of ``benchmarks/cluster_graph.py`` (what stages 1 and 2 leave: the
manifest, survivor fields, band runs), small enough for a test; the clustering runs exactly as the DAG's tasks do
(``clusters.run_step`` per step and task).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from pipeline.dedup.minhash import MinhashConfig, MinhashError, check_config, clusters
from pipeline.dedup.minhash.clusters import components, runs
from pipeline.dedup.minhash.clusters.decide import decision_schema, member_schema
from pipeline.dedup.minhash.clusters.pairs import distinct, edge_schema
from pipeline.io import read_json, sha256_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import cluster_graph  # noqa: E402

CFG = check_config(MinhashConfig(jaccard_check=False))


@pytest.fixture
def graph(tmp_path, monkeypatch):
    """A graph of 20,000 clustered documents over 3 clustering tasks (one task per 5,000 candidate edges), whose
    residual fits one task from 200 edges down: the rounds do the work (as at 10^8 documents)."""
    monkeypatch.setattr(clusters, "EDGES_PER_TASK", 5_000)
    monkeypatch.setattr(components, "BYTES_PER_RESIDUAL", (CFG.memory_mb << 20) // 200)
    def make(name: str) -> Path:
        rdir = tmp_path / name
        cluster_graph.write_graph(rdir, 20_000, seed=3)
        return rdir
    return make


def run_all(rdir: Path, parallelism: int = 3, stop_after: tuple[str, int] | None = None) -> list[tuple[str, int]]:
    """Every step and task in order, as the DAG runs them; ``stop_after`` (step, task) ends the run there, as a
    killed worker would.  Returns the (step, task) pairs that did work (not skipped by their marker)."""
    items = clusters.plan_tasks(rdir, CFG, parallelism)
    worked = []
    for step in clusters.STEPS:
        for item in items[:1] if step in clusters.SINGLE else items:
            before = runs.marker_file(rdir, step, *((0, 1) if step in clusters.SINGLE else (item["task"], item["of"])))
            stamp = before.stat().st_mtime_ns if before.exists() else None
            clusters.run_step(step, item, CFG)
            if not before.exists() or before.stat().st_mtime_ns != stamp:
                worked.append((step, item["task"]))
            if stop_after == (step, item["task"]):
                return worked
    return worked


def decisions(rdir: Path) -> str:
    """sha256 of every decision, in gid order, as stage 4 reads them."""
    import hashlib

    t = clusters.read_decisions(rdir, CFG, 0, 1 << 62)
    assert t.schema == decision_schema() and t.num_rows > 1000
    return hashlib.sha256(repr(t.to_pylist()).encode()).hexdigest()


def test_a_killed_clustering_resumes_at_its_first_uncommitted_task(graph):
    whole = graph("whole")
    assert len(run_all(whole)) == 3 * 10 + 1
    assert clusters.write_summary(whole, CFG)["rounds"] == 2        # ls_1's residual did not fit, ls_2's did
    killed = graph("killed")
    run_all(killed, stop_after=("ss_1", 1))                 # killed after task 2 of 3 of the first small-star round
    runs.marker_file(killed, "ls_2", 0, 3).parent.mkdir(parents=True, exist_ok=True)
    (runs.step_dir(killed, "ls_2") / "t00000-of-00003-edges-0000.arrow").write_bytes(b"half a run")   # a torn write
    resumed = run_all(killed)
    assert resumed[0] == ("ss_1", 2)                        # the first task without a marker
    assert ("ls_1", 0) not in resumed and ("check", 2) not in resumed
    assert decisions(killed) == decisions(whole)
    for step in ("labels", "decide"):                      # the same runs, byte for byte
        for t in range(3):
            mine = read_json(runs.marker_file(killed, step, t, 3))["outputs"]
            for written in mine.values():
                for r in written:
                    assert sha256_file(runs.step_dir(killed, step) / r["run"]) == \
                        sha256_file(runs.step_dir(whole, step) / r["run"])
    assert run_all(killed) == []                            # a finished run: every task skipped by its marker


def test_components_equal_union_find_and_do_not_depend_on_tasks(graph, monkeypatch):
    rdir = graph("three")
    run_all(rdir)
    summary = clusters.write_summary(rdir, CFG)
    assert summary["tasks"] == 3 and summary["rounds"] >= 1
    ctx = clusters.Context(rdir, CFG, 3)
    t = runs.read_range(ctx.band_runs(), 0, runs.SLOTS, edge_schema())
    a, b = distinct(t.column("a").to_numpy(), t.column("b").to_numpy())
    nodes = np.unique(np.concatenate([a, b]))
    root = nodes[components.union(np.arange(len(nodes)), np.searchsorted(nodes, a), np.searchsorted(nodes, b))]
    m = runs.read_range(ctx.inputs("labels", "members"), 0, runs.SLOTS, member_schema())
    order = np.argsort(m.column("node").to_numpy())
    assert np.array_equal(m.column("node").to_numpy()[order], nodes)
    assert np.array_equal(m.column("label").to_numpy()[order], root)
    assert summary["clusters"] == len(np.unique(root)) and summary["docs_in_clusters"] == len(nodes)
    assert summary["removed"]["near_duplicate"] == len(nodes) - len(np.unique(root))
    one = graph("one")
    monkeypatch.setattr(clusters, "EDGES_PER_TASK", 1 << 40)
    run_all(one)
    assert clusters.write_summary(one, CFG)["tasks"] == 1
    assert decisions(one) == decisions(rdir)


def test_a_residual_that_never_fits_stops_naming_the_setting(tmp_path, monkeypatch):
    """A chain of near copies 3,000 long, ids in random order, over 3 tasks: with room for 10 residual edges the
    rounds cannot close it, and finish names the residual and ``minhash.memory_mb``."""
    from pipeline.dedup.minhash.layout import manifest_path
    from pipeline.io import write_json

    rng = np.random.default_rng(0)
    n = 3_000
    ids = rng.permutation(n).astype(np.uint64)
    rdir = tmp_path / "chain"
    manifest = cluster_graph._write_shards(rdir, n, CFG, rng)
    write_json(manifest_path(rdir), manifest)
    import pyarrow as pa

    from pipeline.io import config_digest

    for band in range(CFG.bands):
        w = runs.RunWriter(rdir, "bands", band, CFG.bands, "edges")
        a, b = np.minimum(ids[:-1], ids[1:]), np.maximum(ids[:-1], ids[1:])
        if band == 0:
            w.write(pa.table({"a": a, "b": b}, schema=edge_schema()), runs.slot_of(a))
        runs.commit(rdir, "bands", band, CFG.bands, runs.digest_of("minhash_band", CFG.digest(),
                                                                    config_digest(manifest), band),
                    {"edges": w.written}, {"edges": len(a) if band == 0 else 0})
    monkeypatch.setattr(clusters, "EDGES_PER_TASK", 500)
    monkeypatch.setattr(components, "BYTES_PER_RESIDUAL", (CFG.memory_mb << 20) // 10)
    with pytest.raises(MinhashError, match=r"after 3 rounds [\d,]+ edges are still open .*raise minhash.memory_mb"):
        run_all(rdir)
    monkeypatch.setattr(components, "BYTES_PER_RESIDUAL", 128)        # room for the residual: one component
    run_all(rdir)
    assert clusters.write_summary(rdir, CFG)["clusters"] == 1


def test_the_dag_lists_the_clustering_steps_in_order():
    from pipeline.tasks.steps import BY_ID, CLUSTER_STEPS

    assert CLUSTER_STEPS == clusters.STEPS
    for before, step in zip(("cluster_tasks", *CLUSTER_STEPS), CLUSTER_STEPS, strict=False):
        s = BY_ID[f"near_dedup.{step}"]
        assert s.kind == ("run" if step in clusters.SINGLE else "map")
        assert before == "cluster_tasks" or s.after == (f"near_dedup.{before}",)


def test_the_task_functions_take_the_config_as_the_run_stored_it(graph):
    """The shipped config names ``preset: fineweb``: the run stores that, the plan records the digest of the
    effective config (the preset's values, ``preset`` cleared), and every later task (the finish task reads the
    task count through ``planned_tasks``) must compare like with like.  bench-scale's DAG run failed here."""
    raw = MinhashConfig(preset="fineweb", jaccard_check=False)
    assert raw.digest() != CFG.digest() and check_config(raw).digest() == CFG.digest()
    rdir = graph("preset")
    items = clusters.plan_tasks(rdir, raw, 3)
    assert clusters.planned_tasks(rdir, raw) == len(items) == 3
    for step in clusters.STEPS:
        for item in items[:1] if step in clusters.SINGLE else items:
            clusters.run_step(step, {**item, "of": clusters.planned_tasks(rdir, raw)} if step in clusters.SINGLE
                              else item, raw)
    other = graph("effective")
    run_all(other)
    assert decisions(rdir) == decisions(other)
