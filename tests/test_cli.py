"""The ``tfdata`` command: finding the checkout, running experiments in their own processes,
quick runs kept apart from published reports, and the reports index."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from tfdata import cli

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def fake_checkout(tmp_path, body: str, name: str = "layout"):
    """A checkout with the real shared modules of the experiments and one fake experiment ``name``."""
    exp = tmp_path / "experiments"
    exp.mkdir()
    for shared in os.listdir(os.path.join(REPO, "experiments")):
        if shared.startswith("_") and shared.endswith(".py"):
            shutil.copy(os.path.join(REPO, "experiments", shared), exp / shared)
    (exp / f"{name}.py").write_text(body)
    return tmp_path


GOOD = '''
import os, sys
sys.dont_write_bytecode = True
from _recording import RunRecord, report_dir, write_json
quick = "--quick" in sys.argv
rec = RunRecord("layout", mode="quick" if quick else "full", seeds=[0, 1], command="x")
out = report_dir("layout")
os.makedirs(out, exist_ok=True)
print("working", flush=True)
write_json(os.path.join(out, "results.json"), {"methodology": rec.finish(), "argv": sys.argv[1:],
           "tunables": os.environ.get("GLIBC_TUNABLES", "")})
open(os.path.join(out, "README.md"), "w").write("# t\\n\\n## Findings\\n\\n* **AoS** wins | by `2x`.\\n")
open(os.path.join(out, "plot.png"), "wb").write(b"\\x89PNG")
'''


def test_run_quick_writes_apart_and_indexes(tmp_path):
    root = fake_checkout(tmp_path, GOOD)
    (root / "reports" / "layout").mkdir(parents=True)
    (root / "reports" / "layout" / "README.md").write_text("published")
    rc = cli.main(["--root", str(root), "run", "layout", "--quick", "--", "--seeds", "0"])
    assert rc == 0
    assert (root / "reports" / "layout" / "README.md").read_text() == "published"  # untouched
    out = root / "reports" / "quick" / "layout"
    res = json.loads((out / "results.json").read_text())
    assert res["argv"] == ["--quick", "--seeds", "0"]
    assert "glibc.rtld.optional_static_tls=4096" in res["tunables"]  # jemalloc can load there
    assert "working" in (out / "run.log").read_text()
    index = (root / "reports" / "quick" / "README.md").read_text()
    assert "| [layout](layout/README.md) | quick | 2 |" in index
    assert "AoS wins / by 2x." in index  # markup stripped, the table not broken
    assert "![layout](layout/plot.png)" in index


def test_a_failing_experiment_fails_the_command(tmp_path, capsys):
    root = fake_checkout(tmp_path, "import sys\nprint('boom')\nsys.exit(3)\n")
    assert cli.main(["--root", str(root), "run", "layout", "--quick"]) == 1
    assert "FAILED (exit 3" in capsys.readouterr().err
    assert "boom" in (root / "reports" / "quick" / "layout" / "run.log").read_text()


def test_a_study_runs_its_file_with_its_arguments(tmp_path):
    """replay_ratio is a study of dqn_cartpole.py: the command runs that file with --study."""
    body = GOOD.replace('report_dir("layout")', 'report_dir("replay_ratio")')
    root = fake_checkout(tmp_path, body, name="dqn_cartpole")
    assert cli.main(["--root", str(root), "run", "replay_ratio", "--quick"]) == 0
    res = json.loads((root / "reports" / "quick" / "replay_ratio" / "results.json").read_text())
    assert res["argv"] == ["--study", "replay_ratio", "--quick"]


def test_demo_runs_the_demo_experiments_in_order(tmp_path, monkeypatch):
    """``run demo`` runs :data:`cli.DEMO` (known experiments), each in its own process, quick."""
    assert cli.DEMO and set(cli.DEMO) <= set(cli.EXPERIMENTS)
    ran = []

    def call(cmd, **kwargs):
        ran.append((os.path.basename(cmd[1]), cmd[2:]))
        return 0

    root = fake_checkout(tmp_path, GOOD)
    monkeypatch.setattr(cli.subprocess, "call", call)
    assert cli.main(["--root", str(root), "run", "demo", "--quick"]) == 0
    assert ran == [(f"{cli.STUDIES.get(n, (n,))[0]}.py", ["--quick"]) for n in cli.DEMO]


def test_unknown_experiment_and_missing_checkout(tmp_path, monkeypatch):
    with pytest.raises(SystemExit, match="unknown experiment 'layot'"):
        cli.main(["--root", REPO, "run", "layot"])
    # no checkout above tmp_path, and the package pretends not to live in one either
    monkeypatch.setattr(cli, "__file__", str(tmp_path / "site" / "tfdata" / "cli.py"))
    with pytest.raises(SystemExit, match="no tfdata checkout"):
        cli.find_root(str(tmp_path))


def test_root_is_found_from_a_subfolder():
    assert cli.find_root(os.path.join(REPO, "tfdata", "kernels")) == REPO


def test_entry_points_list_every_experiment():
    out = subprocess.run([sys.executable, "-m", "tfdata", "list"], cwd=REPO, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    for name in cli.EXPERIMENTS:
        stem, study = cli.STUDIES.get(name, (name, []))
        assert " ".join([f"experiments/{stem}.py", *study]) in out.stdout
        assert os.path.exists(os.path.join(REPO, "experiments", f"{stem}.py"))
    script = os.path.join(os.path.dirname(sys.executable), "tfdata")
    if os.path.exists(script):  # the console script of an installed checkout
        out2 = subprocess.run([script, "list"], cwd=REPO, capture_output=True, text=True, timeout=60)
        assert out2.stdout == out.stdout


def test_every_experiment_writes_where_the_cli_says(tmp_path):
    """Each experiment resolves its output folder through report_dir (TFDATA_REPORTS_DIR)."""
    for name, folder in cli.EXPERIMENTS.items():
        stem, _ = cli.STUDIES.get(name, (name, []))
        src = open(os.path.join(REPO, "experiments", f"{stem}.py"), encoding="utf-8").read()
        studies = 'report_dir(s["report"])' in src and f'"report": "{folder}"' in src  # a file of studies
        assert 'report_dir(EXPERIMENT)' in src or f'report_dir("{folder}")' in src or studies, name


def test_hand_written_text_survives_a_rewrite(tmp_path):
    """A report's hand-written block is put back where the code asks for it; a folder without one
    points to the published report."""
    sys.path.insert(0, os.path.join(REPO, "experiments"))
    try:
        import _render
    finally:
        sys.path.remove(os.path.join(REPO, "experiments"))
    out = tmp_path / "layout"
    out.mkdir()
    assert _render.hand_written(str(out), "findings") == [
        "*Findings: written by hand in the published report, `reports/layout/README.md`.*", ""]
    block = "<!-- hand-written: findings -->\n## Findings\n\n* AoS wins.\n<!-- end hand-written -->"
    (out / "README.md").write_text(f"# t\n\n{block}\n\n## Table\n")
    assert _render.hand_written(str(out), "findings") == [block, ""]
    assert _render.hand_written(str(out), "method")[0].startswith("*Method: written by hand")


def test_index_lists_each_machine_of_a_per_machine_report(tmp_path):
    reports = tmp_path / "reports"
    for machine, finding in (("pi-5", "peak RSS 150 MiB"), ("x86_64-vm", "peak RSS 160 MiB")):
        d = reports / "edge" / machine
        d.mkdir(parents=True)
        (d / "README.md").write_text(f"# e\n\n## Findings\n\n* {finding}\n")
        (d / "memory.png").write_bytes(b"\x89PNG")
    (reports / "edge" / "README.md").write_text("the folder's own page, not a machine")
    (reports / "edge" / "empty").mkdir()  # no report in it: not listed
    index = open(cli.write_index(str(reports), str(tmp_path), False), encoding="utf-8").read()
    assert "| [edge/pi-5](edge/pi-5/README.md) |" in index and "peak RSS 150 MiB" in index
    assert "| [edge/x86_64-vm](edge/x86_64-vm/README.md) |" in index
    assert "edge/empty" not in index
    assert "![edge/pi-5](edge/pi-5/memory.png)" in index
    quick = open(cli.write_index(str(reports / "quick"), str(tmp_path), True), encoding="utf-8").read()
    assert "edge/" not in quick
