"""Round 3 of the stale-data study: the report (and the runs, through scripts/stale_study.py).

The runs go through the round-2 scheduler with round 3's arms, so they resume as round 2's did::

    python scripts/stale_study.py --work-dir ~/.cache/areal_m2po/stale_study_r3 \\
        --staleness S --arms grpo,m2po,m2po_tr --seeds 1,2,3 --pilot-staleness=
    python scripts/stale_study.py --work-dir ~/.cache/areal_m2po/stale_study_r3 \\
        --staleness 16 --arms m2po_tr --seeds 1,2,3 --pilot-staleness=

and this script writes docs/stale_study_round3.md and its CSV from the finished runs (round 2's
archive, round 3's work directory) under the rules of scripts/study/verdicts_r3.py::

    python scripts/stale_study_round3.py --staleness S
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys

if os.path.dirname(os.path.abspath(__file__)) not in sys.path:  # when imported by path
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from study.round3 import Round3, write  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="python scripts/stale_study_round3.py", description=__doc__)
    p.add_argument("--staleness", type=int, required=True, help="the paper-regime staleness S")
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument(
        "--roots",
        default="docs/stale_study/runs,~/.cache/areal_m2po/stale_study_r3",
        help="comma-separated run-directory parents, the archive first",
    )
    p.add_argument("--md", default="docs/stale_study_round3.md")
    p.add_argument("--csv", default="docs/stale_study_round3.csv")
    args = p.parse_args(argv)
    plan = Round3(args.staleness, tuple(int(s) for s in args.seeds.split(",")), args.steps)
    roots = [os.path.expanduser(r) for r in args.roots.split(",") if r]
    command = shlex.join(["python", "scripts/stale_study_round3.py", *argv])
    n = write(roots, plan, args.md, args.csv, command)
    print(f"[stale_study_round3] {n} finished run(s) summarised into {args.md}, {args.csv}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
