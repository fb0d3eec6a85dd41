"""The kernel-development scripts of benchmarks/kernels/ that run without a GPU: their CPU modes and their refusals."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import HAS_CUDA, ROOT, load_script

KERNEL_SCRIPTS = ROOT / "benchmarks" / "kernels"


def run_tool(script: str, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # the scripts decide
    return subprocess.run(
        [sys.executable, str(KERNEL_SCRIPTS / script), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


def test_bench_indexer_cpu_dry_run_checks_and_reports(tmp_path):
    # One passthrough and one scored case through the whole script under the interpreter,
    # without the reference: every output is judged by the harness checker on the way.
    out = tmp_path / "bench.json"
    proc = run_tool(
        "indexer.py", "--cpu-dry-run", "--no-reference", "--no-variants", "--warmup", "0", "--iterations", "1",
        "--trials", "1", "--case", "indexer_000*", "--case", "indexer_069*", "--out", str(out),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(out.read_text())
    assert [r["case"] for r in doc["records"]] == ["indexer_000_b1_p1", "indexer_069_b1_p33"]
    assert all(r["passed"] and set(r["us"]) == {"triton", "serial", "plain"} for r in doc["records"])
    assert doc["summary"]["triton_speedup_mean"] is None, "no reference, no speedup"
    assert "all 2 cases" in proc.stdout


_LISTED_PLAN = re.compile(r"  T=(\d+): Plan\(path='(\w+)', splits=(\d+), block_n=(\d+), .*gather_lag=(\d+)\)")


def listed_plans(stdout: str) -> dict[str, dict[int, tuple[str, int, int, int]]]:
    """attention_variants.py --list output as {variant: {T: (path, splits, block_n, gather lag)}}."""
    plans: dict[str, dict[int, tuple[str, int, int, int]]] = {}
    for line in stdout.splitlines():
        found = _LISTED_PLAN.fullmatch(line)
        if found is None:
            plans[line] = {}
            continue
        tokens, path, *numbers = found.groups()
        plans[list(plans)[-1]][int(tokens)] = (path, *map(int, numbers))
    return plans


def test_bench_attention_variants_lists_plans_without_a_gpu():
    # Without a GPU the list uses the H200's residency; whatever the tuned split counts, every
    # plan is a CUDA kernel plan whose splits tile the 2048 slots, with a non-negative lag.
    proc = run_tool("attention_variants.py", "--list", "--variant", "default", "--variant", "cuda_two_launch")
    assert proc.returncode == 0, proc.stderr
    listed = listed_plans(proc.stdout)
    assert list(listed) == ["default", "cuda_two_launch"] and all(list(by_t) == [1, 2, 6, 7, 8] for by_t in listed.values())
    for name, by_t in listed.items():
        for tokens, (path, splits, block_n, lag) in by_t.items():
            assert path in (("cuda", "cuda_cluster") if name == "default" else ("cuda_two_launch",)), (name, tokens, path)
            assert 2048 % splits == 0 and (2048 // splits) % block_n == 0 and lag >= 0, (name, tokens)
            assert tokens * splits <= 132 or path == "cuda_cluster" or splits == 8, "co-resident on 132 SMs, or the fewest splits"


def test_bench_attention_variants_builds_named_cuda_plans():
    """Any cuda_sN / cluster_sN name with a gather lag (cycles) or _landed is a fixed plan;
    other names are refused with the known ones listed."""
    proc = run_tool("attention_variants.py", "--list", "--variant", "cuda_s8_lag1500", "--variant", "cluster_s16_landed")
    assert proc.returncode == 0, proc.stderr
    listed = listed_plans(proc.stdout)
    assert set(listed["cuda_s8_lag1500"].values()) == {("cuda", 8, 64, 1500)}
    assert set(listed["cluster_s16_landed"].values()) == {("cuda_cluster", 16, 64, 2**31 - 1)}
    proc = run_tool("attention_variants.py", "--list", "--variant", "cuda_s16_d1")
    assert proc.returncode == 2 and "unknown variant(s) ['cuda_s16_d1']" in proc.stderr


@pytest.mark.skipif(HAS_CUDA, reason="checks the refusal on a machine without CUDA")
@pytest.mark.parametrize(
    "script,args",
    [("profile_kernels.py", ["topk"]), ("profile_kernels.py", ["phases"]), ("attention_variants.py", []), ("topk_phases.py", [])],
)
def test_gpu_tools_refuse_without_cuda(script, args):
    proc = run_tool(script, *args)
    assert proc.returncode == 2 and "GPU" in proc.stderr


@pytest.mark.slow
def test_kernel_sass_digest_is_stable_and_covers_every_kernel():
    # Two runs give the same digests (an equivalence check across revisions relies on it),
    # one line per CUDA source: the top-k and the attention.
    runs = [run_tool("sass_digest.py") for _ in range(2)]
    for proc in runs:
        if proc.returncode == 2:
            pytest.skip(f"no sm_90 toolchain here: {proc.stderr.strip()[-200:]}")
        assert proc.returncode == 0, proc.stderr
    assert runs[0].stdout == runs[1].stdout
    lines = runs[0].stdout.splitlines()
    assert [line.split()[0] for line in lines] == ["top-k", "attention"], lines
    assert all(re.search(r" [0-9a-f]{16}$", line) for line in lines)


def test_attention_phase_summary_reads_stamps_and_leaves_out_skipped_tiles():
    # Synthetic stamps of 2 calls x 3 programs at 2 GHz: entry ns/cycles, six phase ends, exit ns.
    # Program 2 of call 1 had no valid slot: its first-tile stamp stays 0.
    import torch

    profile_kernels = load_script("profile_kernels")

    def program(start_ns: int, phase_us: list[float]) -> list[int]:
        cycles = [10_000]
        for us in phase_us:
            cycles.append(cycles[-1] + int(us * 2000))
        return [start_ns, *cycles, start_ns + int(sum(phase_us) * 1000)]

    lengths = [1.0, 2.0, 3.0, 0.5, 1.5, 1.0]
    calls = [[program(0, lengths), program(100, lengths), program(200, lengths)] for _ in range(2)]
    calls[1][2][3] = 0  # no first-tile stamp
    p = profile_kernels.phase_summary(torch.tensor(calls, dtype=torch.int64))
    assert abs(p["ghz"] - 2.0) < 1e-3
    for name, us in zip(profile_kernels.PHASES, lengths, strict=True):
        assert abs(p[name] - us) < 1e-3 and abs(p[f"{name} max"] - us) < 1e-3, name
    assert abs(p["start max"] - 0.2) < 1e-9 and abs(p["span"] - (sum(lengths) + 0.2)) < 1e-3
    # Phase ends after the call's first entry: program 1 (start 0.1 µs) is the median, program 2 the
    # last; in call 1 program 2 has no first-tile end, so there the median is the lower of two (torch's
    # median) and the last is program 1; over the two calls the lower middle again.
    for k, name in enumerate(profile_kernels.PHASES):
        end = sum(lengths[: k + 1])
        at, last = (end, end + 0.1) if name == "first tile" else (end + 0.1, end + 0.2)
        assert abs(p[f"{name} at"] - at) < 1e-3 and abs(p[f"{name} last"] - last) < 1e-3, name


def test_profile_kernels_refuses_a_malformed_plan():
    proc = run_tool("profile_kernels.py", "phases", "--plan", "cuda:16")
    assert proc.returncode == 2 and "expected PATH:SPLITS:LAG" in proc.stderr


def test_gather_floor_reorderings_keep_each_programs_slots():
    # The reordered ids the tool times the gathers (and the solution) on: per program the same
    # ids in ascending order, padding last; per row the same ids ascending; consecutive cache
    # rows on exactly the valid slots.
    import torch

    gather_floor = load_script("gather_floor")

    gen = torch.Generator().manual_seed(3)
    ids = torch.full((2, 2048), -1, dtype=torch.int32)
    ids[0, :700] = torch.randperm(50_000, generator=gen)[:700].int()
    ids[1] = torch.randperm(50_000, generator=gen)[:2048].int()
    for splits in (16, 64):
        sorted_ids = gather_floor.program_sorted(ids, splits)
        for s in range(splits):
            before, after = ids[:, s::splits], sorted_ids[:, s::splits]
            for t in range(2):
                valid = before[t][before[t] >= 0].sort().values
                assert torch.equal(after[t, : valid.numel()], valid) and (after[t, valid.numel() :] == -1).all()
    row = gather_floor.row_sorted(ids)
    assert torch.equal(row[0, :700], ids[0, :700].sort().values) and (row[0, 700:] == -1).all()
    dense = gather_floor.contiguous(ids)
    assert torch.equal(dense >= 0, ids >= 0) and torch.equal(dense[1], torch.arange(2048, 4096, dtype=torch.int32))


@pytest.mark.skipif(HAS_CUDA, reason="checks the refusal on a machine without CUDA")
def test_gather_floor_needs_a_gpu():
    proc = run_tool("gather_floor.py", "--iterations", "1")
    assert proc.returncode == 2 and "needs a CUDA GPU" in proc.stderr


@pytest.mark.slow
def test_gather_floor_kernels_compile_alone_with_nvcc(tmp_path):
    nvcc = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").is_file() else None)
    if nvcc is None:
        pytest.skip("nvcc is not installed")
    command = [nvcc, "-arch=sm_90a", "-O3", "-Xptxas", "-v", "-c", str(KERNEL_SCRIPTS / "gather_floor.cu"), "-o", str(tmp_path / "g.o")]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr
    compiled = re.findall(r"Compiling entry function '(\w+)'", proc.stderr)
    assert len(compiled) == 3 and all(any(k in name for name in compiled) for k in ("bulk_gather", "rows_gather", "ldg_gather")), compiled


def test_topk_phases_stamps_every_phase_of_the_shipped_kernel():
    # The stamps go after anchor lines of topk_filtered.cuh: a kernel edit that drops one fails here.
    phases = load_script("topk_phases")
    source = (phases.CSRC / "topk_filtered.cuh").read_text()
    marked = phases.instrument(source)
    assert [marked.count(f" DSA_MARK({m});") for m, _ in phases.MARKS] == [1] * len(phases.MARKS)
    assert "g_info[blockIdx.x * 4] = in_bin;" in marked
    with pytest.raises(SystemExit, match="anchor of phase stamp 4"):
        phases.instrument(source.replace("fast_threshold<kThreads, kFastBins>(f, topk);", "fast_threshold(f);"))


@pytest.mark.slow
def test_topk_phases_driver_builds_with_nvcc(tmp_path):
    nvcc = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").is_file() else None)
    if nvcc is None:
        pytest.skip("nvcc is not installed")
    assert load_script("topk_phases").build(nvcc, tmp_path).is_file()


def test_gather_floor_copy_check_catches_a_wrong_word():
    import torch

    gather_floor = load_script("gather_floor")

    ckv = torch.arange(8 * 64 * 512, dtype=torch.int32).view(8, 64, 256 * 2).to(torch.int16).view(torch.bfloat16)
    ids = torch.full((1, 2048), -1, dtype=torch.int32)
    ids[0, :4] = torch.tensor([7, -1, 300, 64])
    words = ckv.reshape(-1, 512).view(torch.int32)[:, 0]
    sink = torch.zeros(2048, dtype=torch.int32)
    sink[[0, 2, 3]] = words[[7, 300, 64]]
    gather_floor.check_copied(sink, ids, ckv, 4)  # program 1's first slot is padding: not checked
    sink[2] += 1
    with pytest.raises(AssertionError, match="1 programs hold the wrong first word"):
        gather_floor.check_copied(sink, ids, ckv, 4)


def test_gather_floor_landing_summary_finds_a_systematically_slow_sm():
    # Synthetic bulk-gather stamps, 6 calls x 4 programs at 2 GHz: SM 7 always lands 3 µs after
    # entry, the others 1 µs plus a call-dependent jitter; program k runs on SM k + 4 * (k == 3).
    import torch

    gather_floor = load_script("gather_floor")

    calls = []
    for call in range(6):
        programs = []
        for k, sm in enumerate((4, 5, 6, 7)):
            landed_us = 3.0 if sm == 7 else 1.0 + 0.1 * ((call + k) % 3)
            entry_ns = 1_000 * call + 50 * k
            programs.append([sm, entry_ns, 0, int(landed_us * 2000), entry_ns + int(landed_us * 1000)])
        calls.append(programs)
    p = gather_floor.landing_summary(torch.tensor(calls, dtype=torch.int64))
    assert abs(p["ghz"] - 2.0) < 1e-3
    assert abs(p["sm_means"][7] - 3.15) < 1e-6 and max(p["sm_means"], key=p["sm_means"].get) == 7
    assert abs(p["last"] - 3.15) < 1e-6
    assert p["between_sm"] > 0.5 > p["within_sm"] and p["halves_corr"] > 0.9


def test_ncu_stalls_sums_kernels_and_lists_excess_wavefronts(tmp_path):
    # Two profiled kernels of one SASS listing (the same offsets): samples and stalls add up per
    # offset; the excessive shared wavefronts of the second instruction are listed once, summed.
    header = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed", "stall_long_sb",
              "stall_barrier", "L1 Wavefronts Shared Excessive"]  # fmt: skip
    rows = []
    for kernel in range(2):
        rows += [["Kernel Name", f"decode_kernel {kernel}"], header]
        rows.append([f"{0x7f00 + 0x1000 * kernel:x}", "LDG.E.128 R4, desc[UR4][R2.64]", "10", "64", "9", "1", "0"])
        rows.append([f"{0x7f10 + 0x1000 * kernel:x}", "STS.128 [R3], R8", "0", "64", "", "", "96"])
    source = tmp_path / "sass.csv"
    with source.open("w", newline="") as f:
        import csv

        csv.writer(f).writerows(rows)
    proc = run_tool("ncu_stalls.py", str(source))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("kernels 2, samples 20") and "('long_sb', 18)" in lines[0]
    assert re.match(r"0x00000 +20 +128 LDG\.E\.128", lines[1]) and "long_sb:18 barrier:2" in lines[1]
    assert lines[2] == "excessive wavefronts / sectors per instruction:"
    assert re.match(r"0x00010 STS\.128 \[R3\], R8 +L1 Wavefronts Shared Excessive: 192$", lines[3]), lines[3]


@pytest.mark.skipif(HAS_CUDA, reason="the refusal is for a machine without an SM90/SM100 GPU")
def test_mla_decode_error_refuses_a_solution_that_cannot_run_here():
    # FlashMLA's requires (an SM90/SM100 GPU, flash_mla) fail on a CPU: one line naming why, exit 2, no traceback.
    proc = run_tool("mla_decode_error.py", "mla_decode_v32_smoke", "--solution", "flashmla")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "solution flashmla cannot run here: needs a CUDA GPU" in proc.stderr and "Traceback" not in proc.stderr


def test_mla_decode_error_measures_the_reference_and_a_solution_on_cpu():
    # The triton solution (destination passing; under the interpreter without a GPU) beside the reference on one smoke case.
    env_case = "smoke_b2_sq1_k64_bs64_h64"
    proc = subprocess.run(
        [sys.executable, str(KERNEL_SCRIPTS / "mla_decode_error.py"), "mla_decode_v32_smoke", "--solution", "triton", "--cases", env_case],
        cwd=ROOT, env={**os.environ, **({} if HAS_CUDA else {"TRITON_INTERPRET": "1"})}, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines() if line.startswith(f"mla_decode_v32_smoke/{env_case}")]
    assert [r[2] for r in rows] == ["reference", "triton"]
    assert all(float(r[4]) < 1e-4 and r[6] == "0" for r in rows), rows  # lse error, out elements failing vs ref


def test_peer_topk_probe_judges_selections_and_refuses_without_a_gpu():
    # The kernel probe's logits and judge, with torch.topk standing in for SGLang's kernel: a
    # right selection is OK on every distribution, one that drops a winner (or reads past the
    # length) is WRONG; without a GPU the script says why and exits 2.
    probe = load_script("peer_topk_probe")

    def right(logits, lengths, table):
        out = torch.full((logits.shape[0], 2048), -1, dtype=torch.int32)
        for b, n in enumerate(lengths.tolist()):
            k = min(2048, n)
            out[b, :k] = table[b, torch.topk(logits[b, :n], k).indices].int()
        return out

    def drops_a_winner(logits, lengths, table):
        out = right(logits, lengths, table)
        for b, n in enumerate(lengths.tolist()):
            if n > 2048:  # the best position swapped for the best one left out
                order = torch.argsort(logits[b, :n], descending=True)
                out[b][out[b] == order[0]] = int(order[2048])
        return out

    def reads_past_length(logits, lengths, table):
        return right(logits, torch.full_like(lengths, logits.shape[1]), table)

    good = probe.kernel_probes(right, [3000, 5000], torch.device("cpu"), seed=1)
    assert good and all(v.outcome == "OK" for v in good), [v.line() for v in good if v.outcome != "OK"]
    assert {v.name.split("/")[1] for v in good} == set(probe.DISTRIBUTIONS)
    bad = probe.kernel_probes(drops_a_winner, [3000, 5000], torch.device("cpu"), seed=1)
    assert bad and all(v.outcome == "WRONG" and "ranks below the true top-2048" in v.detail for v in bad), [v.line() for v in bad]
    past = {v.name: v for v in probe.kernel_probes(reads_past_length, [3000], torch.device("cpu"), seed=1)}
    assert past["kernel/garbage_past_length/L=3000"].outcome == "WRONG"
    if not HAS_CUDA:
        proc = run_tool("peer_topk_probe.py")
        assert proc.returncode == 2 and "needs a CUDA GPU" in proc.stderr


def test_cluster_topk_variants_edit_the_current_kernel():
    # Every variant's edit finds its anchor in the shipped topk_cluster.cuh and changes it (`shipped`
    # alone leaves it); a kernel that drops an anchor makes the script stop with a message, not time the shipped one.
    script = load_script("cluster_topk_variants")
    text = (ROOT / "solutions" / "triton" / "indexer" / "csrc" / "topk_cluster.cuh").read_text()
    assert script.variant_source("shipped", text) == text
    assert all(script.variant_source(name, text) != text for name in script.VARIANTS if name not in ("shipped", *script.MULTI_PASS))
    with pytest.raises(SystemExit, match="no longer has the anchor"):
        script.variant_source("match_any", text.replace("histogram_add_spread(s.hist", "histogram_add(s.hist"))
    # The multi-pass kernel's variants edit topk_long.cuh instead: every histogram update of long_match_any's list is there.
    long_text = (ROOT / "solutions" / "triton" / "indexer" / "csrc" / "topk_long.cuh").read_text()
    assert all(script.variant_source(name, text) == text for name in script.MULTI_PASS)
    assert script.long_variant_source("long", long_text) == long_text
    aggregated = script.long_variant_source("long_match_any", long_text)
    assert aggregated.count("histogram_add(s.hist") == len(script.SPREAD_UPDATES) and "histogram_add_spread(s.hist" not in aggregated
    with pytest.raises(SystemExit, match="topk_long.cuh no longer has the anchor"):
        anchor = "histogram_add_spread(s.hist, level_bin<0>("
        script.long_variant_source("long_match_any", long_text.replace(anchor, "histogram_add(s.hist, level_bin<0>("))
    assert {"select", "cluster_capacity"} <= set(script.long_topk.SIGNATURES)
