"""Validate raw Criteo TSV files and print what a training run will see.

    python data/check_tsv.py /path/to/train.txt [more.tsv ...]

Files may be gzip-compressed (``train.txt.gz``, ``day_0.gz``), as the trainer and data/preprocess_criteo.py read
them. For each file: rows, click rate, and the share of missing values per integer and categorical column. A
malformed line stops the check with the file and line number (the same parser the trainer uses), so a file that
passes here loads in ``data=criteo_tsv``.

Exit status: 0 every file passes; 1 a file fails the check (``FAIL <file>:<line>: ...``: what is wrong with its
data); 2 a usage error, before any file is read (``error: ...``: no file given, a path that is missing or a
directory).
"""

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dlrm.data.criteo_tsv import NUM_CAT, NUM_INT, TsvFormatError, check_file, open_input, read_tsv  # noqa: E402
from dlrm.errors import InputError  # noqa: E402


def missing_shares(path: str) -> np.ndarray:
    """Share of empty fields per column I1..I13, C1..C26 (float64 ``[39]``) of a plain or gzip file."""
    counts = np.zeros(NUM_INT + NUM_CAT)
    n = 0
    raw, f, _ = open_input(path)
    try:
        for line in f:
            fields = line.rstrip(b"\r\n").split(b"\t")
            if len(fields) < 2:
                continue
            counts += np.array([v == b"" for v in fields[1:]], dtype=np.float64)
            n += 1
    finally:
        f.close()
        raw.close()
    return counts / max(n, 1)


def main(argv: list) -> int:
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    if not argv:
        print(
            "error: no file given; usage: python data/check_tsv.py FILE [FILE ...] (plain or gzip Criteo TSV)",
            file=sys.stderr,
        )
        return 2
    opts = [a for a in argv if a.startswith("-") and not os.path.exists(a)]
    if opts:
        print(f"error: {opts[0]}: unknown option; usage: python data/check_tsv.py FILE [FILE ...]", file=sys.stderr)
        return 2
    # A path that is not a file is the caller's mistake, not a finding about data: refuse it before reading any.
    try:
        for path in argv:
            check_file(path, config_key=None)
    except (InputError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for path in argv:
        try:
            rows = read_tsv(path, config_key=None)
        except TsvFormatError as e:
            print(f"FAIL {e}", file=sys.stderr)
            return 1
        miss = missing_shares(path)
        print(f"{path}: {len(rows):,} rows, click rate {rows.labels.mean():.4f}")
        print("  missing I1..I13: " + " ".join(f"{m:.2f}" for m in miss[:NUM_INT]))
        print("  missing C1..C26: " + " ".join(f"{m:.2f}" for m in miss[NUM_INT:]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
