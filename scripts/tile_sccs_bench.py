#!/usr/bin/env python3
"""Tile the SCCS case benchmark (`outcomes.parquet`, `covariates.parquet`) k times into a larger
one, for the 1e6-case memory and time figures of README "Benchmarks" (issue #13 item 4).

Copy c (0-based) offsets `rowId` by c * max(rowId) and `stratumId` by c * (max(stratumId) + 1),
so row ids stay consecutive (when the input's run 1..max without gaps) and strata stay distinct
and increasing. Outcomes are written in row order; covariates sorted by (covariateId, rowId), the
input's column-major layout. Both zstd, with the input's first row-group size.

    python3 scripts/tile_sccs_bench.py ../shared/data/bench/sccs_N1e5 /tmp/sccs_N1e6 [--copies 10]

Needs pyarrow (installed by .ci/run).
"""
import argparse
import os

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src", help="directory with outcomes.parquet and covariates.parquet")
    ap.add_argument("dst", help="output directory (created)")
    ap.add_argument("--copies", type=int, default=10, help="number of copies (default 10)")
    a = ap.parse_args()
    if a.copies < 1:
        ap.error("--copies must be at least 1")
    o = pq.read_table(os.path.join(a.src, "outcomes.parquet"))
    c = pq.read_table(os.path.join(a.src, "covariates.parquet"))
    for t, name, cols in ((o, "outcomes", ("rowId", "stratumId")), (c, "covariates", ("rowId", "covariateId"))):
        for col in cols:
            if col not in t.column_names:
                raise SystemExit(f"{name}.parquet: no column {col!r} (has {t.column_names})")
            if t[col].null_count:
                raise SystemExit(f"{name}.parquet: column {col!r} has NULLs")
    row_step = pc.max(o["rowId"]).as_py()
    stratum_step = pc.max(o["stratumId"]).as_py() + 1

    def shifted(t: pa.Table, col: str, by: int) -> pa.Table:
        i = t.schema.get_field_index(col)
        return t.set_column(i, col, pc.add(t[col], pa.scalar(by, t.schema.field(i).type)))

    outs, covs = [], []
    for k in range(a.copies):
        outs.append(shifted(shifted(o, "rowId", k * row_step), "stratumId", k * stratum_step))
        covs.append(shifted(c, "rowId", k * row_step))
    big_o = pa.concat_tables(outs)
    big_c = pa.concat_tables(covs).sort_by([("covariateId", "ascending"), ("rowId", "ascending")])
    os.makedirs(a.dst, exist_ok=True)
    for t, name in ((big_o, "outcomes"), (big_c, "covariates")):
        meta = pq.ParquetFile(os.path.join(a.src, f"{name}.parquet")).metadata
        group = meta.row_group(0).num_rows if meta.num_row_groups else len(t)
        pq.write_table(t, os.path.join(a.dst, f"{name}.parquet"), compression="zstd", row_group_size=max(group, 1))
    print(f"{a.dst}: {big_o.num_rows} outcome rows, {big_c.num_rows} covariate entries")


if __name__ == "__main__":
    main()
