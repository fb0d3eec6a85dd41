"""The indexer's batched check gives exactly the per-row spec's verdicts.

``indexer.check`` judges every row at once on the device and asks ``indexer._check_row`` (the
spec, one row at a time) only about rows it flags. Here both judge the same outputs, correct and
mutated, on random small cases: same status, same message, same ``max_abs_error``.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest
import torch

from dsa_bench.definitions import indexer as idx
from dsa_bench.definitions.base import InputRng, Tolerance
from dsa_bench.definitions.status import CheckResult, Status

CPU = torch.device("cpu")
PAGE = idx.PAGE_SIZE
MAX_PAGES = 48  # rows up to 3072 tokens: scored rows, kept small
NUM_PAGES = 256  # room for 4 rows of 48 pages of their own, 48 shared ones and a spare
TOLERANCES = (Tolerance(), Tolerance(score_rtol=0.05), Tolerance(score_rtol=1e-7))
LENGTHS = (0, 1, 63, 64, 65, 2047, 2048, 2049, 2112, 3000, MAX_PAGES * PAGE)


def per_row_check(inputs: dict, out: torch.Tensor, expected: list, tol: Tolerance) -> CheckResult:
    """The checker as it was before it was batched: ``_check_row`` on each row in order."""
    num_pages = inputs["k_index_cache_fp8"].shape[0]
    worst_gap = 0.0
    for b, seq_len in enumerate(inputs["seq_lens"].tolist()):
        problem, gap = idx._check_row(b, out[b], seq_len, inputs["block_table"][b], num_pages, expected[b], tol)
        worst_gap = max(worst_gap, gap)
        if problem is not None:
            return CheckResult(Status.INCORRECT_INDICES, problem, max_abs_error=worst_gap)
    return CheckResult(Status.PASSED, max_abs_error=worst_gap)


def shared_table(seq_lens: list[int], rng: random.Random) -> torch.Tensor:
    """A block table in which later rows reuse some of row 0's pages (prefix caching); the tails
    past each row's pages hold pages no row reaches, or -1."""
    pool = list(range(NUM_PAGES))
    rng.shuffle(pool)
    first, spare, free = pool[:MAX_PAGES], pool[MAX_PAGES], pool[MAX_PAGES + 1 :]
    table = []
    for n in seq_lens:
        n_pages = -(-n // PAGE)
        prefix = rng.randint(0, n_pages)
        own = [free.pop() for _ in range(n_pages - prefix)]
        tail = [rng.choice([-1, spare]) for _ in range(MAX_PAGES - n_pages)]
        table.append(first[:prefix] + own + tail)
    return torch.tensor(table, dtype=torch.int32)


def random_case(seed: int) -> tuple[dict, list, torch.Tensor]:
    rng = random.Random(seed)
    batch = rng.randint(1, 4)
    seq_lens = [rng.choice(LENGTHS) if rng.random() < 0.6 else rng.randint(1, MAX_PAGES * PAGE) for _ in range(batch)]
    axes = idx.DEFINITION.axes({"batch_size": batch, "max_num_pages": MAX_PAGES, "num_pages": NUM_PAGES})
    given: dict = {"seq_lens": torch.tensor(seq_lens, dtype=torch.int32)}
    if rng.random() < 0.4:
        given["block_table"] = shared_table(seq_lens, rng)
    params = {"k_index_cache_fp8": {"distinct_keys": rng.choice([1, 3])}} if rng.random() < 0.25 else {}
    inputs = idx.generate(axes, given, params, InputRng(seed, CPU))
    names = ("q_index_fp8", "k_index_cache_fp8", "weights", "seq_lens", "block_table")
    out = idx.reference(*(inputs[k] for k in names))["topk_indices"]
    expected = idx.expect(inputs)
    if rng.random() < 0.2:  # a checker may also be given scores of rows that select every token
        table, q, w = inputs["block_table"], inputs["q_index_fp8"].float(), inputs["weights"]
        cache = inputs["k_index_cache_fp8"]
        expected = [
            idx.ScoredRow(idx.row_scores(q[b].to(torch.float8_e4m3fn), cache, w[b], table[b], n), 1e-3) for b, n in enumerate(seq_lens)
        ]
    return inputs, expected, out


def mutate(kind: str, inputs: dict, expected: list, out: torch.Tensor, b: int, rng: random.Random) -> bool:
    """Change row b of ``out`` in place the way ``kind`` names; False where the row cannot have it."""
    row = out[b]
    seq_len = int(inputs["seq_lens"][b])
    n_pages = -(-seq_len // PAGE)
    valid = [j for j in range(idx.TOPK) if int(row[j]) >= 0]
    padding = [j for j in range(idx.TOPK) if int(row[j]) < 0]
    reached = set(inputs["block_table"][b, :n_pages].tolist())
    if kind == "shuffle":
        row.copy_(row[torch.randperm(idx.TOPK, generator=torch.Generator().manual_seed(rng.randrange(2**31)))])
    elif kind == "duplicate" and len(valid) >= 2:
        i, j = rng.sample(valid, 2)
        row[j] = row[i]
    elif kind == "beyond_num_pages" and valid:
        row[rng.choice(valid)] = NUM_PAGES * PAGE + rng.randrange(3 * PAGE)
    elif kind == "unreachable_page" and valid:
        page = rng.choice([p for p in range(NUM_PAGES) if p not in reached])
        row[rng.choice(valid)] = page * PAGE + rng.randrange(PAGE)
    elif kind == "past_seq_len" and valid and seq_len % PAGE:
        last_page = int(inputs["block_table"][b, n_pages - 1])
        row[rng.choice(valid)] = last_page * PAGE + rng.randrange(seq_len % PAGE, PAGE)
    elif kind == "one_fewer" and valid:
        row[rng.choice(valid)] = -1
    elif kind == "one_more" and padding:
        row[rng.choice(padding)] = rng.randrange(NUM_PAGES * PAGE)
    elif kind == "below_minus_one":  # in place of padding, the count stays right
        row[rng.choice(padding or valid)] = rng.choice([-2, -2, -(2**31), -rng.randrange(2, 2**31)])
    elif kind.startswith("swap") and expected[b] is not None:
        scores = expected[b].scores
        ids = idx.token_ids(inputs["block_table"][b], seq_len)
        chosen = set(row.tolist())
        inside = [p for p in range(seq_len) if int(ids[p]) in chosen]
        outside = [p for p in range(seq_len) if int(ids[p]) not in chosen]
        if not inside or not outside:  # a row that selects every token has nothing to swap
            return False
        if kind == "swap_near":  # the worst selected token for the best one left out: a near tie
            drop, take = min(inside, key=lambda p: float(scores[p])), max(outside, key=lambda p: float(scores[p]))
        elif kind == "swap_far":
            drop, take = max(inside, key=lambda p: float(scores[p])), min(outside, key=lambda p: float(scores[p]))
        else:
            drop, take = rng.choice(inside), rng.choice(outside)
        row[row.tolist().index(int(ids[drop]))] = ids[take]
    else:
        return False
    return True


KINDS = (
    "shuffle",
    "duplicate",
    "beyond_num_pages",
    "unreachable_page",
    "past_seq_len",
    "one_fewer",
    "one_more",
    "below_minus_one",
    "swap_near",
    "swap_far",
    "swap_random",
)
#: a phrase of each message _check_row writes, and of a pass with a nonzero gap
OUTCOMES = (
    "neither -1 nor a token id",
    "valid ids, expected",
    "appears more than once",
    "beyond num_pages",
    "not among the row's first",
    "not below seq_len",
    "not a top-",
    "passed with a gap",
    "passed",
)


def assert_same(inputs: dict, out: torch.Tensor, expected: list, tol: Tolerance) -> CheckResult:
    """Both checks' verdicts agree, and a passing output never reaches the per-row spec."""
    spec = idx._check_row
    asked: list[int] = []

    def counted(b: int, *args):
        asked.append(b)
        return spec(b, *args)

    idx._check_row = counted
    try:
        got = idx.check(inputs, {"topk_indices": out}, expected, tol)
    finally:
        idx._check_row = spec
    want = per_row_check(inputs, out, expected, tol)
    assert (got.status, got.message, got.max_abs_error) == (want.status, want.message, want.max_abs_error)
    if got.passed:
        assert asked == []
    else:  # only the failing row
        assert asked == [int(got.message.split(":")[0].removeprefix("row "))]
    return got


def test_batched_check_matches_the_per_row_spec_on_random_outputs():
    seen: Counter[str] = Counter()
    for seed in range(60):
        inputs, expected, reference_out = random_case(seed)
        rng = random.Random(1000 + seed)
        for trial in range(6):
            out = reference_out.clone()
            batch = out.shape[0]
            for _ in range(0 if trial == 0 else rng.randint(1, 2)):  # trial 0: the reference itself
                b = rng.randrange(batch)
                mutate(rng.choice(("shuffle", "swap_near") if rng.random() < 0.3 else KINDS), inputs, expected, out, b, rng)
            for tol in TOLERANCES:
                result = assert_same(inputs, out, expected, tol)
                outcome = next((o for o in OUTCOMES if o in result.message), None)
                if result.passed:
                    outcome = "passed with a gap" if result.max_abs_error else "passed"
                assert outcome is not None, result.message
                seen[outcome] += 1
    assert set(seen) == set(OUTCOMES), seen  # every kind of verdict was compared


def test_first_failing_row_decides_and_the_gaps_before_it_count():
    rng = random.Random(7)
    axes = idx.DEFINITION.axes({"batch_size": 4, "max_num_pages": MAX_PAGES, "num_pages": NUM_PAGES})
    inputs = idx.generate(axes, {"seq_lens": torch.tensor([3000, 2049, 0, 2500], dtype=torch.int32)}, {}, InputRng(3, CPU))
    expected = idx.expect(inputs)
    names = ("q_index_fp8", "k_index_cache_fp8", "weights", "seq_lens", "block_table")
    out = idx.reference(*(inputs[k] for k in names))["topk_indices"]
    assert mutate("swap_near", inputs, expected, out, 0, rng)  # row 0: a near tie, a small gap
    assert mutate("duplicate", inputs, expected, out, 1, rng)  # row 1: the first failure
    assert mutate("beyond_num_pages", inputs, expected, out, 3, rng)  # row 3: never reached
    num_pages = inputs["k_index_cache_fp8"].shape[0]
    _, gap0 = idx._check_row(0, out[0], 3000, inputs["block_table"][0], num_pages, expected[0], Tolerance(score_rtol=0.5))
    assert gap0 > 0
    result = assert_same(inputs, out, expected, Tolerance(score_rtol=0.5))
    assert result.message.startswith("row 1: id ") and result.message.endswith("appears more than once")
    assert result.max_abs_error == gap0
    result = assert_same(inputs, out, expected, Tolerance(score_rtol=1e-12))
    assert result.message.startswith("row 0: not a top-2048 set") and result.max_abs_error == gap0
    out[1] = idx.reference(*(inputs[k] for k in names))["topk_indices"][1]
    result = assert_same(inputs, out, expected, Tolerance(score_rtol=0.5))
    assert result.message.startswith("row 3: id ") and "beyond num_pages" in result.message


def test_a_page_listed_twice_in_a_row_takes_its_last_position():
    """Validation refuses such a table and the generator never makes one, but the check reads one
    as the spec does: the page's ids are at its last position, so a slot past seq_len there fails."""
    seq_len = 33 * PAGE + 10  # 34 pages, the last one partly used
    table = torch.arange(MAX_PAGES, dtype=torch.int32)[None].clone()
    table[0, 33] = table[0, 0]  # page 0 at positions 0 and 33
    axes = idx.DEFINITION.axes({"batch_size": 1, "max_num_pages": MAX_PAGES, "num_pages": NUM_PAGES})
    given = {"seq_lens": torch.tensor([seq_len], dtype=torch.int32), "block_table": table}
    inputs = idx.generate(axes, given, {}, InputRng(5, CPU))
    expected = idx.expect(inputs)
    out = torch.cat([torch.arange(20, 32 * PAGE + 20)]).to(torch.int32)[None]  # 2048 distinct ids on pages 0-32
    loose = Tolerance(score_rtol=10.0)  # any set of reachable tokens passes
    result = assert_same(inputs, out, expected, loose)
    assert result.message == f"row 0: id 20 is token position {33 * PAGE + 20}, not below seq_len = {seq_len}"
    out = torch.arange(PAGE, 33 * PAGE).to(torch.int32)[None]  # pages 1-32 only
    assert assert_same(inputs, out, expected, loose).passed


@pytest.mark.parametrize("entry", [-1, NUM_PAGES])
@pytest.mark.parametrize("seq_len", [130, 2112])
def test_a_reached_entry_that_is_no_page_is_left_to_the_spec(entry: int, seq_len: int):
    """Validation refuses such a table; the check still reads it as the spec does. A scored row of
    33 pages can leave out the last one, which then names no page."""
    axes = idx.DEFINITION.axes({"batch_size": 2, "max_num_pages": MAX_PAGES, "num_pages": NUM_PAGES})
    inputs = idx.generate(axes, {"seq_lens": torch.tensor([100, seq_len], dtype=torch.int32)}, {}, InputRng(9, CPU))
    expected = idx.expect(inputs)
    out = idx.reference(*(inputs[k] for k in ("q_index_fp8", "k_index_cache_fp8", "weights", "seq_lens", "block_table")))["topk_indices"]
    last = -(-seq_len // PAGE) - 1
    if seq_len > idx.TOPK:
        out[1] = idx.token_ids(inputs["block_table"][1], idx.TOPK)  # none on the last page
    inputs["block_table"][1, last] = entry
    loose = Tolerance(score_rtol=10.0)
    try:
        want = per_row_check(inputs, out, expected, loose)
    except IndexError:  # the spec cannot read an entry past the cache: neither can the check
        with pytest.raises(IndexError):
            idx.check(inputs, {"topk_indices": out}, expected, loose)
        return
    got = idx.check(inputs, {"topk_indices": out}, expected, loose)
    assert (got.status, got.message, got.max_abs_error) == (want.status, want.message, want.max_abs_error)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_batched_part_never_waits_for_the_device():
    device = torch.device("cuda")
    axes = idx.DEFINITION.axes({"batch_size": 4, "max_num_pages": MAX_PAGES, "num_pages": NUM_PAGES})
    lens = torch.tensor([3000, 2049, 0, 700], dtype=torch.int32)
    inputs = idx.generate(axes, {"seq_lens": lens}, {}, InputRng(3, device))
    expected = idx.expect(inputs)
    out = idx.reference(*(inputs[k] for k in ("q_index_fp8", "k_index_cache_fp8", "weights", "seq_lens", "block_table")))["topk_indices"]
    num_pages = inputs["k_index_cache_fp8"].shape[0]
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for tol in TOLERANCES:
            idx._batched_verdicts(out, inputs["seq_lens"], inputs["block_table"], num_pages, expected, tol)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    for tol in TOLERANCES:
        got = idx.check(inputs, {"topk_indices": out}, expected, tol)
        want = per_row_check(inputs, out, expected, tol)
        assert (got.status, got.message, got.max_abs_error) == (want.status, want.message, want.max_abs_error)
