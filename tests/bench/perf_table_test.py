#!/usr/bin/env python3
"""perf_table_test.py - the check of tests/bench/perf_table.py (the perf-table suite).

perf_table.py writes docs/performance.md's table from `make bench`'s results folder. Here it
runs on a small sample folder, tests/bench/perf_table_fixture/ (made-up figures, not
measurements), whose block must come out as expected.md beside it; then on copies of that
folder with one fault each (a missing table file, a line with a field too few, a target of
no known form, a --quick run, no ort.md), each of which must fail naming the file; and on
documents with and without the markers. The real docs/performance.md must carry the markers once, so that `make bench`
can write it. Prints "ok NAME" or "FAIL NAME: why" per check and "N passed, N failed".

Usage: perf_table_test.py [--filter SUBSTR]
"""
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
SCRIPT = os.path.join(ROOT, "tests", "bench", "perf_table.py")
FIXTURE = os.path.join(ROOT, "tests", "bench", "perf_table_fixture")
DOC = os.path.join(ROOT, "docs", "performance.md")
BEGIN = "<!-- perf-table: begin (written by tests/bench/perf_table.py; do not edit) -->"
END = "<!-- perf-table: end -->"

passed = failed = 0
chosen = sys.argv[2] if len(sys.argv) == 3 and sys.argv[1] == "--filter" else ""


def check(name, ok, why=""):
    global passed, failed
    if chosen not in name:
        return
    if ok:
        passed += 1
        print("ok %s" % name)
    else:
        failed += 1
        print("FAIL %s: %s" % (name, why))


def run(*args):
    p = subprocess.run([sys.executable, SCRIPT] + list(args), capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


def write_into(doc_text, results, work):
    """Writes doc_text to a file in work, runs --write on it; returns (rc, stderr, new text)."""
    doc = os.path.join(work, "doc.md")
    with open(doc, "w", encoding="utf-8") as f:
        f.write(doc_text)
    rc, _, err = run("--results", results, "--write", doc)
    with open(doc, encoding="utf-8") as f:
        return rc, err, f.read()


def faulty(work, name, change):
    """A copy of the fixture named name in work, changed by change(folder)."""
    folder = os.path.join(work, name)
    shutil.copytree(FIXTURE, folder)
    os.remove(os.path.join(folder, "expected.md"))
    change(folder)
    return folder


def main():
    with open(os.path.join(FIXTURE, "expected.md"), encoding="utf-8") as f:
        expected = f.read()
    page = "# Page\n\nbefore\n\n%s\nold figures\n%s\n\nafter\n" % (BEGIN, END)
    with tempfile.TemporaryDirectory(prefix="perf-table-test-") as work:
        rc, err, text = write_into(page, FIXTURE, work)
        check("perf-table/fixture-block", rc == 0 and text == "# Page\n\nbefore\n\n%s\n%s%s\n\nafter\n"
              % (BEGIN, expected, END), "rc %d, %s; wrote:\n%s" % (rc, err.strip(), text))
        rc, err, again = write_into(text, FIXTURE, work)
        check("perf-table/rewrite-is-stable", rc == 0 and again == text, "a second write changed the page")

        rc, out, err = run("--results", FIXTURE, "--print")
        rows = [line for line in out.split("\n") if line.startswith("| ")]
        check("perf-table/print-is-the-block's-table",
              rc == 0 and len(rows) == 13 and all(row in expected.split("\n") for row in rows), "rc %d, %s" % (rc, err.strip()))

        def remove_viz(folder):
            os.remove(os.path.join(folder, "table-viz.tsv"))

        def short_line(folder):
            with open(os.path.join(folder, "table-http.tsv"), "a", encoding="utf-8") as f:
                f.write("http\tonly three\t1.0\n")

        def bad_target(folder):
            with open(os.path.join(folder, "table-http.tsv"), "a", encoding="utf-8") as f:
                f.write("http\tmade up\t1.0\t2.0\tms\t>=10x\t\t\t\t\n")

        def quick(folder):
            with open(os.path.join(folder, "run.tsv"), encoding="utf-8") as f:
                text = f.read().replace("mode\tfull", "mode\tquick")
            with open(os.path.join(folder, "run.tsv"), "w", encoding="utf-8") as f:
                f.write(text)

        def remove_ort(folder):
            os.remove(os.path.join(folder, "ort.md"))

        def remove_run(folder):
            os.remove(os.path.join(folder, "run.tsv"))

        faults = [("missing-table-file", remove_viz, "table-viz.tsv is missing"),
                  ("short-line", short_line, "table-http.tsv:3: 3 fields, expected 10"),
                  ("target-of-no-known-form", bad_target, "table-http.tsv:3: target '>=10x'"),
                  ("quick-run", quick, "run.tsv: a quick run"),
                  ("missing-ort", remove_ort, "ort.md is missing"),
                  ("missing-run", remove_run, "run.tsv is missing")]
        for name, change, words in faults:
            folder = faulty(work, name, change)
            rc, err, text = write_into(page, folder, work)
            check("perf-table/refuses/" + name,
                  rc == 1 and words in err and os.path.join(folder, "") in err and text == page,
                  "rc %d, stderr %r, page %s" % (rc, err.strip(), "kept" if text == page else "changed"))

        folder = faulty(work, "print-without-viz", remove_viz)
        rc, out, err = run("--results", folder, "--print")
        check("perf-table/print-tolerates-a-failed-step", rc == 0 and "visualizer" not in out
              and "| 9 |" in out, "rc %d, %s" % (rc, err.strip()))

        no_markers = "# Page\n\nno markers\n"
        rc, err, text = write_into(no_markers, FIXTURE, work)
        check("perf-table/refuses/doc-without-markers",
              rc == 1 and "doc.md" in err and "perf-table: begin" in err and text == no_markers,
              "rc %d, stderr %r" % (rc, err.strip()))
        twice = page + page
        rc, err, text = write_into(twice, FIXTURE, work)
        check("perf-table/refuses/doc-with-two-blocks", rc == 1 and "found 2 and 2" in err and text == twice,
              "rc %d, stderr %r" % (rc, err.strip()))

    with open(DOC, encoding="utf-8") as f:
        lines = f.read().split("\n")
    check("perf-table/performance.md-has-the-markers",
          lines.count(BEGIN) == 1 and lines.count(END) == 1 and lines.index(BEGIN) < lines.index(END),
          "docs/performance.md needs the lines %r and %r once each, in that order" % (BEGIN, END))
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
