"""Packaging: the adapters/ folder installs as gbmw.adapters, never as a top-level `adapters` module; an installed
wheel (not only an editable clone) carries the bundled recipes; importing the planner loads no torch."""

import os
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_adapters_live_under_the_gbmw_namespace(tmp_path):
    code = (
        "import importlib.util, gbmw.adapters\n"
        "assert importlib.util.find_spec('adapters') is None, 'adapters installed top-level'\n"
        "print('ok')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "ok", result.stderr


def test_planner_does_not_import_torch(tmp_path):
    code = "import sys, gbmw, gbmw.cli.main, gbmw.cost.estimate, gbmw.cli.report\nprint('torch' in sys.modules)\n"
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "False", result.stderr


def test_an_installed_wheel_plans_its_bundled_jobs(tmp_path):
    """`pip install gbmw` from a wheel finds the bundled jobs, models and clusters (package data gbmw.recipes)."""
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                            "-w", str(tmp_path / "wheel"), str(ROOT)], capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = (tmp_path / "wheel").glob("gbmw-*.whl")
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    code = ("import gbmw, gbmw.specs.bundled\n"
            "print(gbmw.__file__, gbmw.specs.bundled.RECIPES_DIR, sep='\\n')\n"
            "print(gbmw.plan_job(gbmw.load_job('gpt-tiny_cpu-x4')).estimate.fits)\n"
            "from gbmw.cli.trust import published_errors\n"
            "print(len(published_errors()))\n")
    environment = dict(os.environ, PYTHONPATH=str(site))  # before the editable install's path finder
    ran = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=environment, capture_output=True, text=True,
                         timeout=120)
    module, recipes, fits, published = ran.stdout.split()
    assert module.startswith(str(site)) and recipes.startswith(str(site)), ran.stdout
    assert fits == "True", ran.stderr[-2000:]
    assert int(published) >= 25  # recipes/published_errors.yaml, the trust line's data, travels in the wheel
