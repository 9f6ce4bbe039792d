"""The config reference in docs/ is generated from the schemas: it must not drift from them."""
import subprocess
import sys

from conftest import ROOT


def test_config_reference_matches_the_schemas():
    proc = subprocess.run([sys.executable, str(ROOT / "docs" / "gen_config_doc.py"), "--check"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
