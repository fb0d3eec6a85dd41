#!/usr/bin/env python
"""Warp-stall samples per SASS instruction from an Nsight Compute source page, summed over kernels.

    ncu --nvtx --nvtx-include "profile/" --clock-control none --warp-sampling-interval 0 \\
        --kernel-name regex:filtered_topk --section WarpStateStats --section SourceCounters -o topk \\
        python benchmarks/kernels/profile_kernels.py ncu --case indexer_127_b31_p91 [--case ... again]
    ncu -i topk.ncu-rep --page source --csv --print-source sass > topk_sass.csv
    python benchmarks/kernels/ncu_stalls.py topk_sass.csv

Prints the sample total and the stall reasons over all profiled kernels, then every instruction
with samples (offset from its kernel's first instruction, samples, warp-level executions, the
instruction, its top three stall reasons), plus every barrier, shared atomic and exit. A warp
waiting at a barrier is sampled on the instruction after it. Then, where the page has the
SourceCounters section's memory columns, every instruction with excessive L1 wavefronts or L2
sectors (bank conflicts, uncoalesced accesses) and how many.
"""

from __future__ import annotations

import argparse
import collections
import csv
from pathlib import Path

SAMPLES = "Warp Stall Sampling (All Samples)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source_csv", type=Path, help="ncu --page source --csv --print-source sass output")
    args = parser.parse_args()
    per_offset: dict[int, list] = collections.OrderedDict()
    totals: collections.Counter[str] = collections.Counter()
    excess: dict[int, collections.Counter[str]] = collections.OrderedDict()
    header: list[str] | None = None
    base = None
    kernels = 0
    with args.source_csv.open(newline="") as f:
        for row in csv.reader(f):
            if row and row[0] == "Kernel Name":
                kernels, header, base = kernels + 1, None, None
            elif row and row[0] == "Address":
                header = row
                col = {h: i for i, h in enumerate(header)}
                stall_columns = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
                excess_columns = [h for h in header if "Excessive" in h]
            elif header and row:
                address = int(row[0], 16)
                base = address if base is None else base
                entry = per_offset.setdefault(address - base, [row[1].strip(), 0, 0, collections.Counter()])
                entry[1] += int(row[col[SAMPLES]] or 0)
                entry[2] += int(row[col["Instructions Executed"]] or 0)
                for name in stall_columns:
                    if row[col[name]] not in ("", "0"):
                        entry[3][name[6:]] += int(row[col[name]])
                        totals[name[6:]] += int(row[col[name]])
                for name in excess_columns:
                    if row[col[name]] not in ("", "0"):
                        excess.setdefault(address - base, collections.Counter())[name] += int(float(row[col[name]]))
    print(f"kernels {kernels}, samples {sum(e[1] for e in per_offset.values())}, stalls {totals.most_common(12)}")
    for offset, (instruction, samples, executed, stalls) in per_offset.items():
        if samples or any(op in instruction for op in ("BAR.SYNC", "ATOMS", "EXIT")):
            reasons = " ".join(f"{k}:{v}" for k, v in stalls.most_common(3))
            print(f"{offset:#07x} {samples:6d} {executed:8d} {instruction[:70]:70s} {reasons}")
    if excess:
        print("excessive wavefronts / sectors per instruction:")
        for offset, counts in excess.items():
            what = " ".join(f"{name}: {n}" for name, n in counts.most_common())
            print(f"{offset:#07x} {per_offset[offset][0][:70]:70s} {what}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
