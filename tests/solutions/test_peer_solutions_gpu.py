"""The indexer peers on the GPU: each one whose packages import passes the cases a run gives it.

Needs an SM90 GPU and the peers' packages (tools/carry_peers.py, docs/peers.md); a peer whose
package is missing is SKIPPED by the run with its reason, and this test skips it too.
"""

from __future__ import annotations

import json

import pytest
from conftest import run_cli

PEERS = ("deepgemm_sglang", "deepgemm_flashinfer")
CASES = {
    # a passthrough batch, one case of each scored band, the largest case; and L = 0, 2048, 2049, 1, 63, 2112
    "indexer_h64": ["indexer_000_b1_p1", "indexer_068_b31_p32", "indexer_069_b1_p33", "indexer_107_b31_p45", "indexer_127_b31_p91"],
    "indexer_smoke": ["smoke_passthrough", "smoke_boundary", "smoke_scored", "smoke_edges"],
}


@pytest.mark.gpu
@pytest.mark.parametrize("workload", list(CASES))
def test_importable_peers_pass_and_get_compared(tmp_path, workload):
    out = tmp_path / "results.json"
    cases = [arg for case in CASES[workload] for arg in ("-c", case)]
    peers = [arg for peer in PEERS for arg in ("-s", peer)]
    proc = run_cli(
        "run", "-w", workload, *cases, "-s", "reference", "-s", "triton", *peers,
        "--warmup", "3", "--iterations", "10", "--trials", "2", "--save", str(out), "--compile-timeout", "3600",
    )  # fmt: skip
    document = json.loads(out.read_text())
    records = document["records"]
    ran = []
    for peer in PEERS:
        mine = [r for r in records if r["solution"] == peer]
        assert len(mine) == len(CASES[workload])
        if all(r["status"] == "SKIPPED" and "cannot be imported" in r["message"] for r in mine):
            continue  # its package is not installed here
        assert [r["status"] for r in mine] == ["PASSED"] * len(mine), [r["message"] for r in mine]
        assert set(document["solution_packages"][peer]) >= {"sgl-deep-gemm", "apache-tvm-ffi"}
        assert "outside the timed calls" in document["solution_notes"][peer]
        ran.append(peer)
    if not ran:
        pytest.skip("no peer's packages import here: " + "; ".join({r["message"] for r in records if r["status"] == "SKIPPED"}))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for r in records:
        if r["solution"] == "triton":
            assert r["status"] == "PASSED" and r["peer"] in ran and r["peer_speedup"] > 0
    assert "vs peer" in proc.stdout
