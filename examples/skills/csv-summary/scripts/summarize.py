"""Print a CSV file's row count and, for each numeric column, its sum, mean, min and max."""

import csv
import sys


def main(path: str) -> None:
    with open(path, newline="", encoding="utf-8", errors="replace") as fh:
        rows = list(csv.DictReader(fh))
    print(f"rows: {len(rows)}")
    if not rows:
        return
    for column in rows[0]:
        values = []
        for row in rows:
            try:
                values.append(float(row[column]))
            except (TypeError, ValueError):
                pass
        if not values:
            print(f"{column}: not numeric")
            continue
        print(f"{column}: sum {sum(values):g}, mean {sum(values) / len(values):g}, "
              f"min {min(values):g}, max {max(values):g} ({len(values)} of {len(rows)} numeric)")


if __name__ == "__main__":
    main(sys.argv[1])
