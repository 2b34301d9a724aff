"""An unreachable hub refuses a `model.hub_id` within seconds and says how to give the fields instead."""

import os
import subprocess
import sys
import time
import urllib.request

import pytest

from harness import REPO_ROOT
from harness.config import hub

# A closed local port: refused at once on any machine.
CLOSED = "http://127.0.0.1:9"


def test_probe_is_cut_at_its_timeout(monkeypatch):
    """A lookup or connect that hangs (a dead network) is given up after the probe's timeout."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(urllib.request, "urlopen", lambda *args, **kwargs: time.sleep(30))
    start = time.monotonic()
    problem = hub.probe_hub(timeout_s=1.0)
    assert time.monotonic() - start < 2.5
    assert problem is not None and "no answer within 1 s" in problem


def test_offline_setting_is_detected_without_a_probe(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert hub.probe_hub() == "HF_HUB_OFFLINE is set"


@pytest.mark.parametrize("endpoint", [None, CLOSED], ids=["huggingface.co", "closed-port"])
def test_unreachable_hub_fails_fast_with_the_way_out(tmp_path, endpoint):
    """This machine has no network to the hub; elsewhere the closed port stands in for it."""
    env = {key: value for key, value in os.environ.items()
           if key not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_ENDPOINT")}
    env.update(HF_HOME=str(tmp_path / "hf"), PYTHONPATH=str(REPO_ROOT), **({"HF_ENDPOINT": endpoint} if endpoint else {}))
    if endpoint is None and hub.probe_hub() is None:
        pytest.skip("the hub is reachable from here")
    start = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "harness.cli", "plan", "model.hub_id=some-org/some-model"],
                         cwd=REPO_ROOT, capture_output=True, text=True, env=env, timeout=120)
    elapsed = time.monotonic() - start
    assert out.returncode != 0
    assert "model.hub_id='some-org/some-model'" in out.stderr
    assert "unreachable" in out.stderr and "model.hf_config." in out.stderr, out.stderr
    assert "Traceback" not in out.stderr and "Retrying" not in out.stderr
    # Interpreter start and composition (~3-5 s on a loaded 2-core machine) plus one probe of at most 3 s.
    assert elapsed < 15, elapsed
