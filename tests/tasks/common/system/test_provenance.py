"""Which code made a result: ``run_summary.json`` and every checkpoint record the suite's version
and, run from this git checkout, its commit and whether tracked files were changed."""
from __future__ import annotations

import subprocess
from pathlib import Path

import torch

import rescale_core
from rescale_tasks.cli import main
from rescale_tasks.common.run import read_summary
from rescale_tasks.common.system import CODE_KEY, code_version, describe_code

REPO = Path(__file__).resolve().parents[4]


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, check=True,
                          timeout=60).stdout.strip()


def test_the_code_version_is_the_checkouts_commit():
    code = code_version()
    assert code["version"] == rescale_core.__version__
    assert code["commit"] == _git("rev-parse", "HEAD")
    assert code["dirty"] == bool(_git("status", "--porcelain", "--untracked-files=no"))
    short = f"commit {code['commit'][:7]}"
    assert describe_code() == f"{code['version']} ({short}{', uncommitted changes' if code['dirty'] else ''})"
    assert describe_code({"version": "1.2.3", "commit": None, "dirty": None}) == "1.2.3"


def test_a_run_records_its_code_in_its_summary_and_checkpoint(tmp_path, run_config, monkeypatch):
    """A checkpoint written before checkpoints carried the code still loads."""
    monkeypatch.chdir(tmp_path)
    config = run_config(tmp_path / "run.yaml", trainer={"default_root_dir": str(tmp_path / "root")})
    assert main(["fit", "--config", config]) == 0
    summary = read_summary(str(tmp_path / "root"))
    assert summary[CODE_KEY] == code_version() and summary[CODE_KEY]["commit"]
    checkpoint = torch.load(summary["checkpoint"], weights_only=True)
    assert checkpoint[CODE_KEY] == code_version()

    del checkpoint[CODE_KEY]
    older = tmp_path / "older.ckpt"
    torch.save(checkpoint, older)
    assert main(["validate", "--config", config, "--ckpt_path", str(older)]) == 0
