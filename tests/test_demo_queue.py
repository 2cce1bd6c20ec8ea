"""``make demo`` leaves no queued Asset event behind: scripts/clear_asset_queue.py on the metadata DB."""

from __future__ import annotations

from conftest import REPO, load_file_module


def _script():
    return load_file_module(REPO / "scripts" / "clear_asset_queue.py")


def test_the_queued_corpus_event_for_pretrain_is_cleared_and_others_kept(airflow_db, capsys):
    from airflow.models.asset import AssetDagRunQueue, AssetModel
    from airflow.models.dag import DagModel
    from airflow.models.dagbundle import DagBundleModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as s:
        if s.get(DagBundleModel, "dags-folder") is None:
            s.add(DagBundleModel(name="dags-folder"))
            s.flush()
        created = [d for d in ("pretrain", "other_consumer") if s.get(DagModel, d) is None]
        s.add_all([DagModel(dag_id=d, bundle_name="dags-folder") for d in created])
        asset = AssetModel(name="mindloom_corpus_queue_test", uri="file:///tmp/mindloom-queue-test/LATEST.json")
        s.add(asset)
        s.flush()
        s.add_all([AssetDagRunQueue(asset_id=asset.id, target_dag_id="pretrain"),
                   AssetDagRunQueue(asset_id=asset.id, target_dag_id="other_consumer")])
        s.flush()       # events an earlier test of the session queued for pretrain (test_dags_e2e) count too
        queued = len(s.scalars(select(AssetDagRunQueue.asset_id).where(
            AssetDagRunQueue.target_dag_id == "pretrain")).all())
    assert _script().main(["pretrain"]) == 0
    assert f"cleared {queued} queued Asset event(s) for pretrain" in capsys.readouterr().out and queued >= 1
    with create_session() as s:
        left = s.scalars(select(AssetDagRunQueue.target_dag_id).where(AssetDagRunQueue.asset_id == asset.id)).all()
    assert left == ["other_consumer"]
    assert _script().clear_queued("pretrain") == 0                      # a second run finds nothing
    with create_session() as s:                                          # leave the session's DB as it was
        _script().clear_queued("other_consumer")
        s.delete(s.get(AssetModel, asset.id))
        for d in created:
            s.delete(s.get(DagModel, d))
