"""The peer workers' shingling (benchmarks/minhash_peers.mindloom_shingles, used by rensa's and datasketch's
workers) is mindloom's own, and importing it loads nothing a peer venv lacks (they have numpy, not mindloom's
other dependencies).  Runs in a fresh interpreter so ``sys.modules`` shows only what that import pulls in."""

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

PROBE = r"""
import json, sys
sys.path.insert(0, "benchmarks")
before = set(sys.modules)
import minhash_peers, topics
via_peers, via_topics = minhash_peers.mindloom_shingles(), topics._load_shingles()
loaded = sorted(set(sys.modules) - before)
installed = sorted({m.split(".")[0] for m in loaded
                    if "site-packages" in str(getattr(sys.modules[m], "__file__", ""))})
text = "The quick brown fox, 2024: snake_case — café x2 jumps over the lazy dog again and again"
print(json.dumps({"loaded": loaded, "installed": installed, "file": sys.modules[via_peers.__module__].__file__,
                  "same": via_peers is via_topics, "shingles": via_peers(text, "word", 5)}))
"""


def test_peer_workers_import_mindloom_shingles_lightly():
    p = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert Path(out["file"]).resolve() == REPO / "pipeline" / "dedup" / "minhash" / "shingles.py"
    assert out["same"]
    sys.path.insert(0, str(REPO))
    from pipeline.dedup.minhash.shingles import shingles

    text = "The quick brown fox, 2024: snake_case — café x2 jumps over the lazy dog again and again"
    assert out["shingles"] == shingles(text, "word", 5)
    project = {m for m in out["loaded"] if m == "pipeline" or m.startswith("pipeline.")}
    assert project == {"pipeline", "pipeline.charclass", "pipeline.configkit", "pipeline.dedup",
                       "pipeline.dedup.minhash", "pipeline.dedup.minhash.config",
                       "pipeline.dedup.minhash.shingles"}, "the peer venvs cannot import more of mindloom"
    assert set(out["installed"]) <= {"numpy"}, f"peer venvs have numpy, not all of {out['installed']}"
