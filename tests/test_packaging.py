"""The adapters/ folder installs as gbmw.adapters, never as a top-level `adapters` module."""

import subprocess
import sys


def test_adapters_live_under_the_gbmw_namespace(tmp_path):
    code = (
        "import importlib.util, gbmw.adapters\n"
        "assert importlib.util.find_spec('adapters') is None, 'adapters installed top-level'\n"
        "print('ok')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "ok", result.stderr


def test_planner_does_not_import_torch(tmp_path):
    code = "import sys, gbmw, gbmw.cli, gbmw.estimate, gbmw.report\nprint('torch' in sys.modules)\n"
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "False", result.stderr
