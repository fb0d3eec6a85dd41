"""Messages a new user meets: misspelt names and keys, `layout --check`'s verdict, `list` in a
narrow terminal."""

from __future__ import annotations

import pytest
from conftest import cli

from dsa_bench.errors import DsaBenchError


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["run", "-w", "indexer_h46", "--no-save"], "unknown workload 'indexer_h46' (did you mean 'indexer_h64'?)"),
        (["run", "-w", "indexer_smoke", "-s", "tritn", "--no-save"], "unknown solution 'tritn' (did you mean 'triton'?)"),
        (["run", "-w", "indexer_smoke", "-c", "smoke_scord", "--no-save"], "matches smoke_scord (did you mean 'smoke_scored'?)"),
    ],
)
def test_a_misspelt_name_gets_a_suggestion_on_short_lines(args, fragment):
    proc = cli(*args)
    assert proc.returncode == 2 and fragment in proc.stderr, proc.stderr
    assert max(len(line) for line in proc.stderr.splitlines()) <= 140, proc.stderr


def test_a_misspelt_yaml_key_is_reported_as_the_unknown_field_first(tmp_path):
    from dsa_bench.workloads import load_workload

    path = tmp_path / "wl.yaml"
    path.write_text("name: x\ndefintion: dsa_topk_indexer_fp8_h64_d128_topk2048_ps64\ntrace: t.jsonl\n")
    with pytest.raises(DsaBenchError) as raised:
        load_workload(path)
    assert "defintion: unknown field (did you mean 'definition'?)" in str(raised.value)
    assert str(raised.value).index("defintion") < str(raised.value).index("more problem")


def test_layout_check_says_its_verdict():
    proc = cli("layout", "--check", "--with-indexer")
    assert proc.returncode == 0 and proc.stdout.splitlines()[-1].startswith("check passed: every block above"), proc.stdout
    assert cli("layout", "--check").stdout.splitlines()[-1].startswith("check passed: no shared block to check")


def test_list_fits_the_terminal_and_speaks_no_internal_words(monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    proc = cli("list")
    assert proc.returncode == 0, proc.stderr
    assert max(len(line) for line in proc.stdout.splitlines()) <= 100
    assert "Issue " not in proc.stdout
    assert "indexer_h64" in proc.stdout and "128 cases shaped like the contest's indexer traffic" in " ".join(proc.stdout.split())
