"""Drop the Asset events queued for a DAG (``make demo`` runs this for ``pretrain`` at its end).

Why: ``make demo`` runs ``corpus_build`` and then ``pretrain`` with ``airflow dags test``.  The corpus publish queues
an Asset event for ``pretrain`` (when its DAG exists and is unpaused), and ``dags test pretrain`` does not consume
it, so the next ``make airflow`` would start a second, unrequested training run from it.  The demo already trained
on that corpus; the queue is cleared so that ``make airflow`` starts nothing until the next publish.
"""

from __future__ import annotations

import sys


def clear_queued(dag_id: str) -> int:
    """Delete the queued Asset events (``asset_dag_run_queue`` rows) that would start ``dag_id``; return how many."""
    from airflow.models.asset import AssetDagRunQueue
    from airflow.utils.session import create_session
    from sqlalchemy import delete

    with create_session() as session:
        return session.execute(delete(AssetDagRunQueue).where(AssetDagRunQueue.target_dag_id == dag_id)).rowcount


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    for dag_id in args or ["pretrain"]:
        n = clear_queued(dag_id)
        print(f"cleared {n} queued Asset event(s) for {dag_id}: `make airflow` starts it on the next corpus publish")
    return 0


if __name__ == "__main__":
    sys.exit(main())
