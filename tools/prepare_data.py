#!/usr/bin/env python
"""Convert a dataset into FastRL's canonical format and print a summary.

Examples:
    python tools/prepare_data.py --dataset geometry3k \\
        --train data/hub/geometry3k/train.parquet --val data/hub/geometry3k/test.parquet \\
        --out data/geometry3k
    python tools/prepare_data.py --dataset easy_vqa --out data/easy_vqa
    python tools/prepare_data.py --dataset math --train math/train.jsonl --summary-only
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from fastrl.data.canonical import write_canonical
from fastrl.data.loaders import DATASETS, LoadedData, load_records
from fastrl.data.record import DataError
from fastrl.data.summary import format_summary, summarize

FORMATS = """\
source formats (--dataset):
  geometry3k, geoqa8k
      Hugging Face hub parquet of Geometry3K / GeoQA8K-R1V (jsonl with the same keys also works).
      Columns: images  - list of encoded images: bytes, or the Hugging Face datasets Image struct
                         {bytes, path} (a path is read relative to the file), at least one per row;
               problem - question text (string); "<image>" placeholders, when present, must match
                         the number of images;
               answer  - ground-truth answer (non-empty string).
  math
      MATH-style text data, parquet or jsonl with problem (string) and answer (string; integers in
      jsonl are accepted). An images column is read when present.
  canonical
      Files written by this tool (parquet: question_id int64, problem string, answer string,
      images list<binary>, metadata JSON string). Useful with --summary-only.
  easy_vqa
      The easy-vqa package data (MIT; installed from requirements.txt, no download). No --train /
      --val / --test: train is the package's train split (38,575 questions), val the first 2,000
      of its test split and test (held out: data.test_size) the other 7,673.

--train / --val / --test take a file, a directory (all .parquet / .jsonl files in it, sorted) or a glob.

output (--out DIR): DIR/train.parquet, DIR/val.parquet (and DIR/test.parquet with --test) in the
canonical format and DIR/summary.json. Training question ids start at 0, validation ids at
1,000,000,000, held-out test ids at 2,000,000,000 (never equal).

bad rows (corrupt or missing image, empty answer, non-string problem, invalid JSON line):
--on-bad-row error (default) stops with the file, row, column and reason; --on-bad-row skip
skips them and reports how many (and which) in the summary.
"""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=FORMATS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--dataset", required=True, choices=DATASETS, help="source format (see below)")
    parser.add_argument("--train", help="training split path (not for easy_vqa)")
    parser.add_argument("--val", help="validation split path (not for easy_vqa)")
    parser.add_argument("--test", help="held-out test split path (not for easy_vqa; data.test_path)")
    parser.add_argument("--out", type=Path, help="output directory for the canonical files")
    parser.add_argument("--summary-only", action="store_true", help="validate and summarize, write nothing")
    parser.add_argument("--on-bad-row", choices=("error", "skip"), default="error", help="default: error")
    parser.add_argument("--cache-dir", help="easy_vqa conversion cache (default $FASTRL_CACHE_DIR or ~/.cache/fastrl)")
    parser.add_argument("--max-train", type=int, help="keep only the first N training rows")
    parser.add_argument("--max-val", type=int, help="keep only the first N validation rows")
    parser.add_argument("--max-test", type=int, help="keep only the first N held-out test rows")
    parser.add_argument("--top-answers", type=int, default=15, help="answers listed in the distribution")
    args = parser.parse_args(argv)
    if args.dataset == "easy_vqa":
        if args.train or args.val or args.test:
            parser.error("--dataset easy_vqa reads the embedded package data; drop --train / --val / --test")
    elif not args.train and not args.val:
        parser.error(f"--dataset {args.dataset} needs --train and/or --val")
    if not args.summary_only and args.out is None:
        parser.error("give --out DIR, or --summary-only")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    splits = {"train": args.train, "val": args.val, "test": args.test}
    limits = {"train": args.max_train, "val": args.max_val, "test": args.max_test}
    loaded: dict[str, LoadedData] = {}
    try:
        for split, path in splits.items():
            if args.dataset != "easy_vqa" and path is None:
                continue
            loaded[split] = load_records(
                args.dataset, path, split=split, on_bad_row=args.on_bad_row,
                cache_dir=args.cache_dir, limit=limits[split],
            )
    except DataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for a, b in (("train", "val"), ("train", "test"), ("val", "test")):
        if a in loaded and b in loaded:
            common = {r.question_id for r in loaded[a].records} & {r.question_id for r in loaded[b].records}
            if common:
                print(f"error: {len(common)} question id(s) in both {a} and {b}, e.g. {sorted(common)[:5]}", file=sys.stderr)
                return 2
    summary: dict = {"dataset": args.dataset, "splits": {}}
    for split, data in loaded.items():
        split_summary = summarize(data.records, top_answers=args.top_answers)
        report = data.report
        split_summary["load"] = {
            "paths": report.paths,
            "rows_read": report.rows_read,
            "rows_skipped": report.rows_skipped,
            "bad_rows": [b.message() for b in report.bad_rows[:50]],
        }
        summary["splits"][split] = split_summary
        print(format_summary(split, split_summary))
        print(f"  rows read {report.rows_read}, skipped as bad {report.rows_skipped}")
        for bad in report.bad_rows[:5]:
            print(f"    bad: {bad.message()}")
        if not args.summary_only:
            out = write_canonical(data.records, args.out / f"{split}.parquet")
            print(f"  wrote {out}")
    if not args.summary_only:
        (args.out / "summary.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
        print(f"wrote {args.out / 'summary.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
