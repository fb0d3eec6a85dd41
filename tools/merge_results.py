"""Merge results files of one workload that cover different cases into one results file.

Used when a run was split over several device calls (e.g. a session's time limit stopped the
first part): every record keeps the speedup measured in its own run, since each case's reference
and solutions were timed side by side in the same process. The files must agree on workload,
settings, timer, GPU and solution content hashes, and no (case, solution) may appear twice.

Usage: python tools/merge_results.py PART1.json PART2.json [...] -o MERGED.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

MUST_AGREE = ("format", "version", "workload", "settings", "timer", "l2_flush")


def merge(paths: list[Path]) -> dict:
    docs = [json.loads(p.read_text()) for p in paths]
    first = docs[0]
    merged = {k: v for k, v in first.items() if k not in ("records", "complete", "finished")}
    seen: dict[tuple[str, str], str] = {}
    records = []
    for path, doc in zip(paths, docs, strict=True):
        for key in MUST_AGREE:
            if doc.get(key) != first.get(key):
                raise SystemExit(f"{path}: field {key!r} differs from {paths[0]}")
        if doc["environment"].get("gpu") != first["environment"].get("gpu"):
            raise SystemExit(f"{path}: GPU {doc['environment'].get('gpu')} differs from {paths[0]}")
        for name, info in doc["solutions"].items():
            if name in first["solutions"] and info["content_hash"] != first["solutions"][name]["content_hash"]:
                raise SystemExit(f"{path}: solution {name!r} has another content hash than in {paths[0]}")
        for record in doc["records"]:
            key = (record["case"], record["solution"])
            if key in seen:
                raise SystemExit(f"{path}: {key} already came from {seen[key]}")
            seen[key] = str(path)
            records.append(record)
    merged["records"] = records
    merged["complete"] = True
    merged["finished"] = max(d.get("finished") or d["created"] for d in docs)
    merged["merged_from"] = [
        {"file": p.name, "created": d["created"], "finished": d.get("finished"), "complete": d["complete"], "records": len(d["records"])}
        for p, d in zip(paths, docs, strict=True)
    ]
    return merged


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("parts", type=Path, nargs="+")
    parser.add_argument("-o", "--out", type=Path, required=True)
    args = parser.parse_args()
    merged = merge(args.parts)
    args.out.write_text(json.dumps(merged, indent=1))
    cases = len({r["case"] for r in merged["records"]})
    print(f"wrote {args.out}: {len(merged['records'])} records over {cases} cases from {len(args.parts)} files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
