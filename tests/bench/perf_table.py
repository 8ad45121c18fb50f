#!/usr/bin/env python3
"""perf_table.py - the table of `make bench`, made from its results folder.

tests/bench/run.sh leaves one results folder (build/bench/results): each step writes its
rows as table-STEP.tsv, bench_ort.sh its own table as ort.md, and run.sh the run's facts as
run.tsv. This script is the one place that turns them into the table: run.sh prints it into
summary.txt (--print), and after a full run that failed nothing it rewrites the part of
docs/performance.md between the two perf-table markers (--write DOC), so that the page holds
the latest figures and no history.

A row of table-STEP.tsv has ten tab-separated fields: section, scenario, ours, peer, unit,
target, GFLOP/s (ours / peer), ns per number (ours / peer), peak RSS, note. ratio is "how many
times faster ours is": peer/ours for times, ours/peer for rates (unit req/s). A target "N" asks
for ratio >= N; "<N MiB" asks for ours' peak RSS under N MiB; "<N ns" for ours under N ns per
number; "<=N" for ours within N times peer's time, and then the ratio shown is ours/peer.

Usage:
  perf_table.py [--results DIR] --print        the table, as run.sh's summary shows it
  perf_table.py [--results DIR] --write DOC    rewrites DOC between the markers
Exit status 0; 1 with a message naming the file at fault (a missing or malformed result
file, a --quick run for --write, a DOC without its markers).
"""
import argparse
import os
import re
import sys

# The steps whose rows make the table, in the order of the table (run.sh runs them so).
STEPS = ("kernel", "json", "http", "grpc", "store", "s3store", "checkpoint", "reductions",
         "sequences", "viz")
FIELDS = 10
BEGIN = "<!-- perf-table: begin"
END = "<!-- perf-table: end -->"
NUMBER = re.compile(r"^[0-9.]+$")
# The forms a target may take (the rules above); anything else is a step's mistake, refused
# rather than shown as it came.
TARGET = re.compile(r"^([0-9.]+|<=[0-9.]+|<[0-9.]+ (MiB|ns))?$")


class ResultsError(Exception):
    """A results folder that cannot make the table; the message names the file."""


def positive(text):
    return bool(NUMBER.match(text)) and float(text) > 0


def verdict(fields):
    """The ratio and target cells of one row (the rules at the top of this file)."""
    ours, peer, unit, target, rss = fields[2], fields[3], fields[4], fields[5], fields[8]
    ratio, met = "-", ""
    if positive(ours) and positive(peer):
        r = float(ours) / float(peer) if unit == "req/s" else float(peer) / float(ours)
        ratio = "%.2fx" % r
        if NUMBER.match(target):
            met = " ok" if r >= float(target) else " MISSED"
    shown = "" if target == "" else (target if target.startswith("<") else ">=" + target + "x")
    if re.match(r"^<=[0-9.]+$", target):
        shown = target + "x"
        if positive(ours) and positive(peer):
            r = float(ours) / float(peer)
            ratio = "%.2fx" % r
            met = " ok" if r <= float(target[2:]) else " MISSED"
        else:
            met = " MISSED"
    elif re.match(r"^<.* ns$", target):
        limit = float(re.match(r"^<([0-9.]+)", target).group(1))
        met = " ok" if positive(ours) and float(ours) < limit else " MISSED"
    elif target.startswith("<"):
        limit = float(re.match(r"^<([0-9.]+)", target).group(1))
        first = rss.split(" ")[0] if rss else ""
        met = " ok" if positive(first) and float(first) < limit else " MISSED"
    return ratio, shown + met


def read_rows(results, require_all):
    """The rows of every table-STEP.tsv in results, each a list of FIELDS strings. A missing
    file is an error when require_all (a full run has every one); a malformed line always."""
    rows = []
    for step in STEPS:
        path = os.path.join(results, "table-%s.tsv" % step)
        if not os.path.exists(path):
            if require_all:
                raise ResultsError("%s is missing: the %s step of tests/bench/run.sh did not "
                                   "write its rows" % (path, step))
            continue
        with open(path, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                line = line.rstrip("\n")
                if line == "":
                    continue
                fields = line.split("\t")
                if len(fields) != FIELDS:
                    raise ResultsError("%s:%d: %d fields, expected %d" %
                                       (path, number, len(fields), FIELDS))
                if not TARGET.match(fields[5]):
                    raise ResultsError("%s:%d: target %r is none of N, <=N, <N MiB, <N ns" %
                                       (path, number, fields[5]))
                rows.append(fields)
    if require_all and not rows:
        raise ResultsError("%s: no rows in its table-*.tsv files" % results)
    return rows


def table_lines(rows):
    """The numbered table and its notes, as run.sh's summary has always shown them."""
    out = ["| # | scenario | ours | peer | ratio | target | GFLOP/s | ns/number | peak RSS |",
           "|---|---|---|---|---|---|---|---|---|"]
    notes, said = [], set()
    for n, f in enumerate(rows, 1):
        ratio, target = verdict(f)
        unit = "ns/num" if f[4] == "ns" else f[4]
        ours = "-" if f[2] == "" else "%s %s" % (f[2], unit)
        peer = "-" if f[3] == "" else "%s %s" % (f[3], unit)
        out.append("| %d | %s | %s | %s | %s | %s | %s | %s | %s |" %
                   (n, f[1], ours, peer, ratio, target, f[6], f[7], f[8]))
        if f[9] != "" and f[9] not in said:
            said.add(f[9])
            notes.append("  #%d: %s" % (n, f[9]))
    return out + ["", "Notes:"] + notes


def read_run(results):
    """run.tsv as a dict: commit, machine, load, mode (full or quick), seconds."""
    path = os.path.join(results, "run.tsv")
    if not os.path.exists(path):
        raise ResultsError("%s is missing: tests/bench/run.sh writes it at the end of a run" % path)
    run = {}
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            key, sep, value = line.rstrip("\n").partition("\t")
            if not sep:
                raise ResultsError("%s:%d: not KEY<TAB>VALUE" % (path, number))
            run[key] = value
    for key in ("commit", "machine", "load", "mode"):
        if key not in run:
            raise ResultsError("%s: no %s line" % (path, key))
    return run


def doc_block(results):
    """The text between the markers: the run's facts, the table, ONNX Runtime's table."""
    run = read_run(results)
    if run["mode"] != "full":
        raise ResultsError("%s: a %s run; only a full `make bench` writes docs/performance.md"
                           % (os.path.join(results, "run.tsv"), run["mode"]))
    rows = read_rows(results, require_all=True)
    ort = os.path.join(results, "ort.md")
    if not os.path.exists(ort):
        raise ResultsError("%s is missing: the ort step of tests/bench/run.sh did not write it"
                           % ort)
    with open(ort, encoding="utf-8") as f:
        ort_lines = f.read().rstrip("\n").split("\n")
    lines = ["The latest `make bench`, at commit %s on %s; load average at its end %s. Medians;"
             " ratio = how many times faster ours is; GFLOP/s and ns/number: ours / peer." %
             (run["commit"], run["machine"], run["load"]), ""]
    # The notes as a list: the summary's indented lines would run together in markdown.
    lines += [("- " + line.strip()) if line.startswith("  #") else line for line in table_lines(rows)]
    lines += ["", "Against ONNX Runtime (`tests/bench/bench_ort.sh`):", ""] + ort_lines
    return lines


def write_doc(doc, block):
    """Replaces the lines between DOC's begin and end markers (both kept) by block."""
    with open(doc, encoding="utf-8") as f:
        text = f.read().split("\n")
    begins = [i for i, line in enumerate(text) if line.startswith(BEGIN)]
    ends = [i for i, line in enumerate(text) if line == END]
    if len(begins) != 1 or len(ends) != 1 or ends[0] < begins[0]:
        raise ResultsError("%s: needs one line starting %r and, after it, one line %r "
                           "(found %d and %d)" % (doc, BEGIN, END, len(begins), len(ends)))
    text[begins[0] + 1:ends[0]] = [""] + block + [""]
    with open(doc + ".tmp", "w", encoding="utf-8") as f:
        f.write("\n".join(text))
    os.replace(doc + ".tmp", doc)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--results", default="build/bench/results")
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--print", action="store_true", dest="print_table")
    mode.add_argument("--write", metavar="DOC")
    args = parser.parse_args()
    try:
        if args.print_table:
            print("\n".join(table_lines(read_rows(args.results, require_all=False))))
        else:
            write_doc(args.write, doc_block(args.results))
            print("perf_table.py: %s written from %s" % (args.write, args.results))
    except (ResultsError, OSError) as e:
        print("perf_table.py: %s" % e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
