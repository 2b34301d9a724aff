"""A cached host profile records the load it was measured under; a loaded or foreign one is measured again."""

from __future__ import annotations

import json

from harness.launch.host_profile import stale_reason


def profile(tmp_path, load: float, cores: int = 2):
    path = tmp_path / "cpu-host.json"
    path.write_text(json.dumps({"cores_per_node": cores, "raw": {"load_average": [load, load, load]}}))
    return path


def test_a_profile_measured_quietly_is_kept(tmp_path):
    assert stale_reason(profile(tmp_path, load=1.5), load_now=6.0, cpus=2) is None


def test_a_profile_measured_under_load_is_measured_again_once_the_host_is_quiet(tmp_path):
    reason = stale_reason(profile(tmp_path, load=7.0), load_now=2.2, cpus=2)
    assert reason == "it was measured under load 7.0 on 2 CPUs and the load is 2.2 now"


def test_under_load_still_it_is_kept_with_a_warning(tmp_path, capsys):
    assert stale_reason(profile(tmp_path, load=7.0), load_now=8.0, cpus=2) is None
    assert "measured under load 7.0 on 2 CPUs" in capsys.readouterr().err


def test_a_profile_of_another_core_count_is_measured_again(tmp_path):
    assert stale_reason(profile(tmp_path, load=0.5, cores=8), load_now=0.5, cpus=2) == (
        "it was measured on 8 cores and this host has 2")


def test_a_profile_whose_ranks_waited_for_a_core_is_measured_again_though_the_load_average_looked_quiet(tmp_path):
    """The load average lags by a minute; the calibration's own wait for a core (the scheduler's run delay) does
    not."""
    path = profile(tmp_path, load=1.5)
    data = json.loads(path.read_text())
    data["raw"]["core_wait_share"] = 0.4
    path.write_text(json.dumps(data))
    assert stale_reason(path, load_now=1.0, cpus=2) == (
        "it was measured while its ranks waited for a core 40% of the time (load 1.5 on 2 CPUs) and the load is "
        "1.0 now")
    data["raw"]["core_wait_share"] = 0.02
    path.write_text(json.dumps(data))
    assert stale_reason(path, load_now=1.0, cpus=2) is None


def test_the_under_load_warning_fits_the_terminal(tmp_path, capsys, monkeypatch):
    """Printed before a plan or a recommend table, the warning wraps to COLUMNS as the table does."""
    path = profile(tmp_path, load=2.8)
    data = json.loads(path.read_text())
    data["raw"]["core_wait_share"] = 0.11
    path.write_text(json.dumps(data))
    monkeypatch.setenv("COLUMNS", "100")
    assert stale_reason(path, load_now=4.0, cpus=2) is None
    err = capsys.readouterr().err
    assert "waited for a core 11% of the time (load 2.8 on 2 CPUs)" in " ".join(err.split())
    assert max(len(line) for line in err.splitlines()) <= 100 < len(" ".join(err.split()))
