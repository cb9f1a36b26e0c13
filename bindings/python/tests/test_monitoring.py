"""Monitoring (SPEC §13): `atlasboost run --metrics` scraped as Prometheus scrapes it, read with
Prometheus's own text parser (`prometheus_client`), against the fake driver's known values."""

from __future__ import annotations

import signal
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from helpers import ATLASBOOST, PYTHON, REPO, clean_env, finish, free_port_pair, start

FAKE_DRIVER = REPO / "target" / "debug" / "libdrvdsmi_host.so"


def free_port() -> int:
    """A port free now, below the kernel's ephemeral range (where no outgoing connection takes
    it before the launcher binds it)."""
    return free_port_pair()


def test_metrics_have_npu_exporters_names_labels_and_the_drivers_values(tmp_path: Path) -> None:
    assert FAKE_DRIVER.is_file(), f"{FAKE_DRIVER} is missing: cargo build -p atlasboost-fake-dsmi"
    port = free_port()
    proc = start(
        [
            ATLASBOOST, "run", "--probe", "dsmi", "-H", "127.0.0.1",
            "--metrics", f"127.0.0.1:{port}", "--monitor-interval", "1",
            "--", PYTHON, "-c", "import time; print('up', flush=True); time.sleep(60)",
        ],
        env=clean_env(ATLASBOOST_DSMI_LIB=str(FAKE_DRIVER), ATLASBOOST_FAKE_DSMI_DEVICES="2"),
        cwd=tmp_path,
    )
    try:
        text = ""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
                    text = r.read().decode()
            except OSError:
                text = ""
            # A sample after both workers printed their line (one every --monitor-interval).
            if "npu_chip_info_utilization{" in text and text.count("_output_lines_total{rank") == 2 and all(
                line.endswith(" 1") for line in text.splitlines() if line.startswith("atlasboost_rank_output_lines_total{")
            ):
                break
            time.sleep(0.2)
        assert "npu_chip_info_utilization{" in text, f"no sample within 30 s:\n{text}"
    finally:
        proc.send_signal(signal.SIGTERM)
        done = finish(proc, 30)
    assert done.returncode == 143, done.describe()

    samples: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples.setdefault(s.name, []).append(s)

    def by_device(name: str) -> dict[int, float]:
        found = {}
        for s in samples[name]:
            labels = s.labels
            assert labels["model_name"] == "Ascend910", s
            assert labels["host"] == "127.0.0.1", s
            assert labels["job"].startswith("ab-"), s
            # Device p runs rank p here (one host, physical ids 0 and 1).
            assert labels["rank"] == labels["id"], s
            found[int(labels["id"])] = s.value
        return found

    # The fake driver's values for physical id p (atlasboost-sim/fake-dsmi/src/telemetry.rs).
    assert by_device("npu_chip_info_utilization") == {p: (10 + 7 * p) % 100 for p in (0, 1)}
    assert by_device("npu_chip_info_temperature") == {p: 40 + p for p in (0, 1)}
    assert by_device("npu_chip_info_power") == {p: (2000 + 50 * p) / 10 for p in (0, 1)}
    assert by_device("npu_chip_info_hbm_used_memory") == {p: 1024 + 512 * p for p in (0, 1)}
    assert by_device("npu_chip_info_hbm_total_memory") == {0: 65536, 1: 65536}
    assert by_device("npu_chip_info_health_status") == {0: 1, 1: 1}
    assert by_device("npu_chip_info_error_code") == {0: 0, 1: 0}
    assert [s.value for s in samples["machine_npu_nums"]] == [2]
    assert [s.value for s in samples["atlasboost_attempt"]] == [0]
    up = {s.labels["rank"]: s.value for s in samples["atlasboost_rank_up"]}
    assert up == {"0": 1, "1": 1}
    lines = {s.labels["rank"]: s.value for s in samples["atlasboost_rank_output_lines_total"]}
    assert lines == {"0": 1, "1": 1}, text
    assert {s.labels["rank"] for s in samples["atlasboost_rank_resident_bytes"]} == {"0", "1"}
