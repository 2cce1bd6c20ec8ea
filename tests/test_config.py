"""The typed config: strict loading with errors that name the field, and the Params derived from it."""

from __future__ import annotations

import pytest
from conftest import REPO

from pipeline.config import DEFAULT_CONFIG, load_config
from pipeline.configkit import ConfigError
from pipeline.form import PARAM_FIELDS, config_from_params, param_specs


def test_default_config_loads():
    cfg = load_config(DEFAULT_CONFIG)
    assert {s.domain for s in cfg.sources} == {"code", "encyclopedia", "docs", "zh"}
    assert cfg.pack.seq_len >= 8 and cfg.train.mode == "graph"


@pytest.mark.parametrize(("override", "message"), [
    ({"train.mode": "turbo"}, "train.mode: must be one of ['graph', 'pynative'], got 'turbo'"),
    ({"train.steps": "many"}, "train.steps: expected an integer, got 'many'"),
    ({"train.steps": 0}, "train.steps: must be >= 1, got 0"),
    ({"pack.seq_lenn": 64}, "pack.seq_lenn: unknown field"),
    ({"tokenizer.vocab_size": 10}, "tokenizer.vocab_size: must be >= 300, got 10"),
    ({"ingest.strict": "yes"}, "ingest.strict: expected true or false, got 'yes'"),
    ({"domains": ["klingon"]}, "domains[0]: unknown domain 'klingon'"),
    ({"train.min_lr": 1.0}, "train.min_lr: must be <= train.lr"),
])
def test_bad_values_name_the_field(override, message):
    with pytest.raises(ConfigError) as err:
        load_config(DEFAULT_CONFIG, override)
    assert message in str(err.value)


def test_yaml_syntax_error_names_file_and_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("seed: 1\ntrain:\n  steps: [1,\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"bad\.yaml:\d+: invalid YAML"):
        load_config(bad)


def test_params_map_onto_config_fields():
    specs = param_specs(load_config(DEFAULT_CONFIG))
    assert set(specs) == set(PARAM_FIELDS)
    assert specs["train_mode"]["enum"] == ["graph", "pynative"]
    assert specs["seq_len"]["minimum"] == 8
    cfg = config_from_params({"seq_len": 256, "train_steps": 7, "domains": ["code"]}, DEFAULT_CONFIG)
    assert (cfg.pack.seq_len, cfg.train.steps, [s.domain for s in cfg.active_sources()]) == (256, 7, ["code"])


def test_config_digest_is_stable_and_sensitive():
    assert load_config(DEFAULT_CONFIG).digest() == load_config(DEFAULT_CONFIG).digest()
    assert load_config(DEFAULT_CONFIG).digest() != load_config(DEFAULT_CONFIG, {"seed": 99}).digest()


def test_each_dag_form_shows_only_its_fields_in_sections():
    from pipeline.form import FORMS

    cfg = load_config(DEFAULT_CONFIG)
    corpus, train = param_specs(cfg, form="corpus"), param_specs(cfg, form="train")
    assert not {n for n in corpus if n.startswith("train_") or n in ("model_preset", "batch_size", "learning_rate")}
    assert not {"seq_len", "vocab_size", "near_dedup_threshold", "domains"} & set(train)
    assert list(corpus) == [n for names in FORMS["corpus"].values() for n in names]
    assert corpus["near_dedup_threshold"]["section"] == "Deduplication"
    assert "Allowed: 0 to 1." in corpus["near_dedup_threshold"]["description"]
    # Empty defaults are optional (nullable), so the form does not mark them required.
    assert corpus["domains"]["type"] == ["array", "null"] and corpus["domains"]["default"] is None
    assert corpus["seq_len"]["type"] == "integer"


def test_params_cannot_choose_the_config_file_and_nulls_mean_the_yaml_value(tmp_path):
    other = tmp_path / "other.yaml"
    other.write_text("seed: 999\n", encoding="utf-8")
    cfg = config_from_params({"config_path": str(other), "domains": None, "seq_len": None}, DEFAULT_CONFIG)
    default = load_config(DEFAULT_CONFIG)
    assert cfg.seed == default.seed and cfg.domains == default.domains and cfg.pack.seq_len == default.pack.seq_len


def test_the_run_status_page_escapes_every_value(tmp_path):
    from operators.run_status import status_page
    from pipeline.io import write_json

    (tmp_path / "main").mkdir()
    write_json(tmp_path / "main" / "status.json", {"state": "FAILED", "step": 9, "error": "Boom: <script>x</script>"})
    page = status_page("pretrain", "<img src=x>", "failed", "my <b>run</b>",
                       [{"task_id": "train_main", "state": "failed", "try_number": 2, "map_index": -1}],
                       {"main": tmp_path / "main"})
    assert "<script>" not in page and "<img" not in page and "<b>run" not in page
    assert "FAILED at step 9: Boom: &lt;script&gt;" in page and "my &lt;b&gt;run&lt;/b&gt;" in page
    assert "/dags/pretrain/runs/%3Cimg%20src%3Dx%3E/tasks/train_main?try_number=2" in page


def test_train_job_defaults_come_from_the_train_config():
    """One default per field: a TrainJob built without the config trains with train.*'s defaults, and
    ``batch_size`` means the global batch everywhere (the job's per-rank share is ``micro_batch``)."""
    import dataclasses

    from pipeline.train.config import TrainConfig
    from pipeline.train.job import TrainJob

    recipe = {f.name: f.default for f in dataclasses.fields(TrainConfig) if f.default is not dataclasses.MISSING}
    job = TrainJob(stage="s", data_dir="d", out_dir="o")
    shared = [f.name for f in dataclasses.fields(TrainJob) if f.name in recipe]
    assert {"lr", "warmup_steps", "checkpoint_every", "steps", "min_lr"} <= set(shared)
    assert {n: getattr(job, n) for n in shared} == {n: recipe[n] for n in shared}
    assert not hasattr(job, "batch_size") and job.micro_batch == recipe["batch_size"]
    assert job.model == {"preset": recipe["preset"]}


def test_a_config_names_a_base_and_only_what_it_changes(tmp_path):
    """``base: other.yaml``: maps merge key by key, lists and values are replaced, each file's relative paths are
    taken from its own folder; a loop of bases and a bad base value are errors that name the file."""
    import yaml

    from pipeline.config import load_config
    from pipeline.configkit import ConfigError

    (tmp_path / "site").mkdir()
    (tmp_path / "base.yaml").write_text(yaml.safe_dump({
        "data_root": "data", "train": {"steps": 7, "lr": 0.01},
        "sources": [{"domain": "code", "reader": "jsonl", "paths": ["in/code.jsonl"]}]}))
    (tmp_path / "site" / "site.yaml").write_text(yaml.safe_dump({
        "base": "../base.yaml", "train": {"steps": 9},
        "sources": [{"domain": "prose", "reader": "jsonl", "paths": ["prose.jsonl"]}]}))
    cfg = load_config(tmp_path / "site" / "site.yaml")
    assert (cfg.train.steps, cfg.train.lr) == (9, 0.01)                 # merged: steps changed, lr kept
    assert cfg.data_root == str(tmp_path / "data")                      # the base's path, from the base's folder
    assert [(s.domain, s.paths) for s in cfg.sources] == [("prose", [str(tmp_path / "site" / "prose.jsonl")])]
    (tmp_path / "base.yaml").write_text(yaml.safe_dump({"base": "site/site.yaml"}))
    with pytest.raises(ConfigError, match=r"site\.yaml: base: files include each other "
                                          r"\(.*site\.yaml -> .*base\.yaml -> .*site\.yaml\)"):
        load_config(tmp_path / "site" / "site.yaml")
    (tmp_path / "site" / "site.yaml").write_text(yaml.safe_dump({"base": 3}))
    with pytest.raises(ConfigError, match=r"site\.yaml: base: expected the path of another config file, got 3"):
        load_config(tmp_path / "site" / "site.yaml")


def test_the_shipped_configs_load():
    from pipeline.config import load_config

    configs = sorted((REPO / "configs").glob("*.yaml"))
    assert [p.name for p in configs] == ["ablation.yaml", "default.yaml"]
    ablation = load_config(REPO / "configs" / "ablation.yaml")
    default = load_config(REPO / "configs" / "default.yaml")
    assert ablation.quality == default.quality and ablation.ablation.seeds >= 4   # the shipped chain is the base's
