"""Contest mode: a seed drawn from the OS, withheld until the run ends and recorded after it;
redacted copies for publishing; secret and public results never mixed by compare or baseline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import ROOT, cli, run_cli
from synthetic_results import write_results

from dsa_bench.errors import DsaBenchError
from dsa_bench.results.records import load_results, redact_document
from dsa_bench.run.case_context import correctness_seeds
from dsa_bench.run.execute import execute
from dsa_bench.run.plan import plan_run
from dsa_bench.run.request import RunRequest
from dsa_bench.run.resume import secret_seed
from dsa_bench.workloads import derive_seed

SMOKE_SEED = 7  # workloads/indexer_smoke.yaml


def test_a_secret_run_withholds_its_seed_until_it_ends_then_records_it(tmp_path):
    save = tmp_path / "secret.json"
    request = RunRequest(workload="indexer_smoke", solutions=["reference"], cases=["smoke_passthrough", "smoke_boundary"], device="cpu",
                         save=save, secret=True, redact=True)  # fmt: skip
    plan = plan_run(request, ROOT)
    drawn = plan.options.settings.seed
    assert plan.secret and drawn != SMOKE_SEED
    seen_mid_run = []
    outcome = execute(plan, lambda record: seen_mid_run.append(json.loads(save.read_text())["settings"]["seed"]))
    assert seen_mid_run == [None, None], "the file never shows the seed while the run goes on"
    document = load_results(save).document
    assert document["secret"] is True and document["complete"] is True
    assert document["settings"]["seed"] == drawn, "recorded once the run ended"
    for record in outcome.records:  # the recorded seed reproduces every input set
        assert record.seeds["correctness"] == [derive_seed(drawn, record.case, "check", s) for s in range(2)]
    redacted = json.loads(plan.redacted_path.read_text())
    assert plan.redacted_path == tmp_path / "secret.redacted.json"
    assert redacted["redacted"] is True and redacted["settings"]["seed"] is None
    assert redacted["records"] == [{"case": r.case, "solution": "reference", "status": "PASSED", "axes": {}} for r in outcome.records]


@pytest.mark.slow
def test_the_cli_prints_no_seed_and_two_secret_runs_draw_different_seeds(tmp_path):
    seeds, outputs = [], []
    for n in range(2):
        save = tmp_path / f"run{n}.json"
        proc = run_cli("run", "-w", "indexer_smoke", "-c", "smoke_passthrough", "-s", "reference", "--device", "cpu",
                       "--secret", "--json-lines", "--save", str(save))  # fmt: skip
        assert proc.returncode == 0, proc.stdout + proc.stderr
        document = json.loads(save.read_text())
        seeds.append(document["settings"]["seed"])
        outputs.append(proc.stdout + proc.stderr)
        record_line = json.loads(proc.stdout.splitlines()[0])
        assert record_line["seeds"] == {}, "json lines of a secret run carry no seeds"
    assert seeds[0] != seeds[1]
    for seed, output in zip(seeds, outputs, strict=True):
        assert str(seed) not in output
        for derived in (derive_seed(seed, "smoke_passthrough", "check", s) for s in range(2)):
            assert str(derived) not in output


def test_secret_refuses_a_seed_and_redact_refuses_no_save():
    with pytest.raises(DsaBenchError, match="--secret draws the seed from the OS"):
        plan_run(RunRequest(workload="indexer_smoke", solutions=["reference"], device="cpu", secret=True, seed=3, no_save=True), ROOT)
    with pytest.raises(DsaBenchError, match="--redact writes a redacted copy"):
        plan_run(RunRequest(workload="indexer_smoke", solutions=["reference"], device="cpu", redact=True, no_save=True), ROOT)
    proc = cli("run", "-w", "indexer_smoke", "--secret", "--seed", "3", "--no-save")
    assert proc.returncode == 2 and "--secret draws the seed" in proc.stderr and "Traceback" not in proc.stderr


def test_a_workload_setting_makes_a_run_secret(tmp_path):
    workload = tmp_path / "secret_smoke.yaml"
    workload.write_text(
        (ROOT / "workloads" / "indexer_smoke.yaml").read_text().replace("name: indexer_smoke", "name: secret_smoke")
        .replace("../traces/", f"{ROOT / 'traces'}/").replace("  seed: 7\n", "  seed: 7\n  secret: true\n")
    )  # fmt: skip
    plan = plan_run(RunRequest(workload=str(workload), solutions=["reference"], device="cpu", no_save=True), ROOT)
    assert plan.secret and plan.options.settings.seed != SMOKE_SEED
    assert plan.header().secret is True
    with pytest.raises(DsaBenchError, match="is secret"):
        plan_run(RunRequest(workload=str(workload), solutions=["reference"], device="cpu", no_save=True, seed=7), ROOT)
    workload.write_text(workload.read_text().replace("secret: true", "secret: 1"))
    with pytest.raises(DsaBenchError, match="secret"):
        plan_run(RunRequest(workload=str(workload), solutions=["reference"], device="cpu", no_save=True), ROOT)


def test_a_public_run_is_unchanged():
    plan = plan_run(RunRequest(workload="indexer_smoke", solutions=["reference"], device="cpu", no_save=True), ROOT)
    header = plan.header().written()
    assert not plan.secret and "secret" not in header and "secret" not in header["settings"]
    assert header["settings"]["seed"] == SMOKE_SEED
    assert correctness_seeds(plan.options.settings, plan.cases[0])[0] == derive_seed(SMOKE_SEED, plan.cases[0].id, "check", 0)


def _secret(path: Path, seed: int | None = 1) -> Path:
    document = json.loads(path.read_text())
    document["secret"] = True
    document["settings"]["seed"] = seed
    path.write_text(json.dumps(document))
    return path


def test_resuming_a_secret_run_takes_its_recorded_seed(tmp_path):
    public = write_results(tmp_path / "public.json", "w", {"c": {"reference": 1.0}})
    assert secret_seed(_secret(write_results(tmp_path / "s.json", "w", {"c": {"reference": 1.0}}), 123)) == 123
    with pytest.raises(DsaBenchError, match="cannot resume a public run"):
        secret_seed(public)
    with pytest.raises(DsaBenchError, match="never recorded its seed"):
        secret_seed(_secret(write_results(tmp_path / "k.json", "w", {"c": {"reference": 1.0}}), None))


def test_compare_and_baseline_refuse_to_mix_secret_and_public(tmp_path):
    latencies = {"c1": {"reference": 1.0, "triton": 0.1}}
    public = write_results(tmp_path / "public.json", "indexer_h64", latencies)
    secret = _secret(write_results(tmp_path / "secret.json", "indexer_h64", latencies))
    other_secret = _secret(write_results(tmp_path / "other.json", "indexer_smoke", latencies))
    baseline = tmp_path / "baseline.json"
    assert cli("baseline", "update", str(public), "-b", str(baseline)).returncode == 0
    proc = cli("compare", str(secret), "-b", str(baseline))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert str(secret) in proc.stderr and str(baseline) in proc.stderr and "public.json" in proc.stderr
    assert "secret" in proc.stderr and "Traceback" not in proc.stderr
    assert cli("compare", str(public), "-b", str(baseline)).returncode == 0, "public against public still compares"
    # a secret workload added to a public baseline, and secret and public files given together
    proc = cli("baseline", "update", str(other_secret), "-b", str(baseline))
    assert proc.returncode == 2 and "indexer_h64" in proc.stderr and str(baseline) in proc.stderr, proc.stderr
    proc = cli("baseline", "update", str(public), str(other_secret), "-b", str(tmp_path / "mixed.json"))
    assert proc.returncode == 2 and str(other_secret) in proc.stderr and str(public) in proc.stderr, proc.stderr
    assert not (tmp_path / "mixed.json").exists()
    # a secret baseline, and a secret run compared with it
    secret_baseline = tmp_path / "secret_baseline.json"
    assert cli("baseline", "update", str(secret), "-b", str(secret_baseline)).returncode == 0
    assert json.loads(secret_baseline.read_text())["workloads"]["indexer_h64"]["secret"] is True
    assert cli("compare", str(secret), "-b", str(secret_baseline)).returncode == 0
    assert cli("compare", str(public), "-b", str(secret_baseline)).returncode == 2


def test_results_redact_and_what_refuses_a_redacted_file(tmp_path):
    latencies = {"c1": {"reference": 1.0, "triton": 0.1}, "c2": {"reference": 2.0, "triton": 0.5}}
    full = write_results(tmp_path / "full.json", "indexer_h64", latencies)
    out = tmp_path / "published.json"
    proc = cli("results", "redact", str(full), "-o", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    published = json.loads(out.read_text())
    assert published["redacted"] is True and published["settings"]["seed"] is None
    assert all(set(r) == {"case", "solution", "status", "axes"} and r["axes"] == {} for r in published["records"])
    assert load_results(out).records[0].status.value == "PASSED", "a redacted file is still a results file"
    assert cli("results", "redact", str(full), "-o", str(full)).returncode == 2, "never overwrites its input"
    baseline = tmp_path / "baseline.json"
    assert cli("baseline", "update", str(full), "-b", str(baseline)).returncode == 0
    for args in (["compare", str(out), "-b", str(baseline)], ["baseline", "update", str(out), "-b", str(tmp_path / "b2.json")]):
        proc = cli(*args)
        assert proc.returncode == 2 and "redacted" in proc.stderr, (args, proc.stderr)


def test_redaction_drops_every_case_detail():
    document = {"format": "dsa-bench-results", "settings": {"seed": 5, "trials": 3}, "solution_notes": {"x": "y"},
                "records": [{"case": "c", "solution": "s", "status": "INCORRECT_NUMERICAL", "axes": {"b": 2}, "message": "row 3: 0.5",
                             "seeds": {"correctness": [1]}, "timing": {"samples_ms": [[1.0]]}, "max_abs_error": 0.5}]}  # fmt: skip
    redacted = redact_document(document)
    assert redacted["records"] == [{"case": "c", "solution": "s", "status": "INCORRECT_NUMERICAL", "axes": {}}]
    assert redacted["settings"] == {"seed": None, "trials": 3} and "solution_notes" not in redacted
    assert document["settings"]["seed"] == 5, "the full document is left as it was"


def test_results_merge_refuses_secret_and_public_parts(tmp_path):
    public = write_results(tmp_path / "public.json", "indexer_h64", {"c1": {"reference": 1.0}})
    secret = _secret(write_results(tmp_path / "secret.json", "indexer_h64", {"c2": {"reference": 1.0}}), seed=1)
    proc = cli("results", "merge", str(public), str(secret), "-o", str(tmp_path / "merged.json"))
    assert proc.returncode == 2 and "field 'secret' differs" in proc.stderr and str(secret) in proc.stderr, proc.stderr
    assert not (tmp_path / "merged.json").exists()
