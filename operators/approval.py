"""The approval of a corpus before it is published: Airflow's human-in-the-loop ``ApprovalOperator``.

Why here: ``publish`` registers the corpus as the latest one and as a dedup release, and its Asset event starts
``pretrain``, which on a cluster commits hundreds of device-hours. A scheduled refresh should not do that unseen.
The task waits in ``awaiting_input`` (Airflow 3.3: no worker slot, no triggerer) with the run's headline
(documents in and kept per domain, removals by reason, the MindRecord size, the release it extends) and a link
to the report. *Approve* lets ``publish`` run. *Reject* skips ``publish`` and everything after it, so no corpus is
registered and no ``pretrain`` run starts; the reason typed into the form is written to the task log.

Whether a run waits is the run's own ``approval`` setting (``pipeline.tasks.approval.needs_approval``): with
``refresh`` (the default) ``corpus_refresh`` runs wait and ``corpus_build`` runs pass straight through.
"""

from __future__ import annotations

from datetime import timedelta
from urllib.parse import quote

from airflow.providers.standard.operators.hitl import ApprovalOperator
from airflow.sdk import Param

REASON = "reason"


class CorpusApproval(ApprovalOperator):
    """Approve or reject a finished corpus run before ``publish``; passes through when its config says so."""

    def __init__(self, *, response_timeout: timedelta | None = None, **kwargs):
        kwargs.pop("params", None)  # the DAG's form: this task's params are the person's form (the run's own
        # settings come from its frozen config.json, not from params)
        super().__init__(subject="Publish corpus run {{ run_id }} for training?",
                         body="The run's headline is written when it is ready.",
                         params={REASON: Param("", type="string", title="Reason",
                                               description="Why (recorded in the task log on a rejection)")},
                         ignore_downstream_trigger_rules=True, response_timeout=response_timeout, **kwargs)

    def execute(self, context):
        from operators.params import config_path
        from pipeline.config import load_config
        from pipeline.io import run_dir
        from pipeline.tasks.approval import needs_approval, prepare_approval
        from pipeline.tasks.run_state import load_run_config

        dag_id, run_id = context["dag"].dag_id, context["run_id"]
        rdir = run_dir(load_config(config_path()).data_root, run_id)
        setting = load_run_config(rdir).approval
        if not needs_approval(setting, dag_id):
            self.log.info("approval: %s: %s runs publish without waiting", setting, dag_id)
            return {"approved": True, "waited": False}
        self.body = prepare_approval(rdir, f"/mindloom/reports/{dag_id}/{quote(run_id, safe='')}")
        return super().execute(context)

    def execute_complete(self, context, event):
        chosen = (event.get("chosen_options") or [""])[0]
        reason = ((event.get("params_input") or {}).get(REASON) or "").strip() or "(no reason given)"
        who = event.get("responded_by_user") or {}
        name = who.get("name") if isinstance(who, dict) else who
        if chosen == self.REJECT:
            self.log.warning("corpus run %s rejected by %s: %s; publish and pretrain are skipped",
                             context["run_id"], name, reason)
        elif chosen == self.APPROVE:
            self.log.info("corpus run %s approved by %s: %s", context["run_id"], name, reason)
        return super().execute_complete(context, event)
