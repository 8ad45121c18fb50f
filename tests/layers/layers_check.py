#!/usr/bin/env python3
"""layers_check.py - the server's layering (server/LAYERS), checked against its includes.

Reads the table of modules in server/LAYERS and every #include in server/, and
reports each rule broken with the file, the line and the rule:

  - a module includes only its own files and the public headers of the modules its
    row names; a row names only modules above it (lower layers), so no two modules
    can include each other;
  - within a folder a file is included by its bare name, across folders as
    "module/file.h", and the file must exist;
  - *_internal.h, *_private.h, *.inc and the headers a "private:" row names are
    private to their folder;
  - a library header the table assigns (lib: cblas.h kernel) is included by that
    module alone;
  - the modules' include graph has no circle (a circle is also a rule broken, but
    each is named as a circle so that the fix is clear);
  - the table of modules in docs/design.md ("| module | may include |") is the
    table of LAYERS: the same modules in the same order, each with the same row,
    so that the maintainers' map never drifts from the rule; the first module that
    differs is named.

Then it checks itself: on a copy of server/ it plants an upward include, a circle
between two modules and an include of another folder's private header, and on a
copy of design.md a missing row and two rows swapped, and each must be reported.
Prints "ok NAME" or "FAIL NAME: why" a check and ends with "N passed, N failed"
(tests/run.sh adds these up).

  layers_check.py [--root DIR] [--design FILE] [--filter SUBSTR]
"""
import argparse
import os
import re
import shutil
import sys
import tempfile

INCLUDE = re.compile(r'^\s*#\s*include\s+([<"])([^>"]+)[>"]')
TABLE_ROW = re.compile(r'^\|([^|]*)\|([^|]*)\|$')
PRIVATE = re.compile(r'(_internal\.h|_private\.h|\.inc)$')
SOURCES = ('.c', '.h', '.inc')


def read_table(path):
    """Returns (order, allowed, libs, problems, private): the modules bottom to top,
    what each may include, the library headers and their module, what is wrong with
    the table itself, and the headers a "private:" row names."""
    order, allowed, libs, problems, private = [], {}, {}, [], set()
    with open(path) as f:
        for number, line in enumerate(f, 1):
            line = line.split('#', 1)[0].strip()
            if not line:
                continue
            words = line.split()
            if words[0] == 'lib:':
                if len(words) != 3:
                    problems.append(f'{path}:{number}: a lib row is "lib: HEADER MODULE"')
                else:
                    libs[words[1]] = words[2]
                continue
            if words[0] == 'private:':
                private.update(words[1:])
                continue
            module, deps = words[0], [w for w in words[1:] if w != '-']
            if module in allowed:
                problems.append(f'{path}:{number}: {module} has two rows')
            for dep in deps:
                if dep not in allowed:
                    problems.append(f'{path}:{number}: {module} names {dep}, which is not a '
                                    f'module below it in the table')
            order.append(module)
            allowed[module] = set(deps)
    for header, module in libs.items():
        if module not in allowed:
            problems.append(f'{path}: lib {header} names {module}, which has no row')
    for header in private:
        if not os.path.exists(os.path.join(os.path.dirname(path), header)):
            problems.append(f'{path}: private {header} is no file')
    return order, allowed, libs, problems, private


def read_doc_table(path):
    """The rows of the first Markdown table of path headed "| module | may include |",
    as (module, [modules it may include]) in order, or None when path has no such
    table."""
    rows = None
    with open(path) as f:
        for line in f:
            m = TABLE_ROW.match(line.strip())
            cells = [c.strip() for c in m.groups()] if m else None
            if rows is None:
                if cells == ['module', 'may include']:
                    rows = []
                continue
            if cells is None:
                break
            if not cells[0].strip('-: '):
                continue            # the line under the header
            rows.append((cells[0], [w for w in cells[1].split() if w != '-']))
    return rows


def compare_doc(doc_path, table):
    """What differs between the module table of doc_path and LAYERS (table, as
    read_table returns it): the first module out of place, and each row that names
    other modules.  Empty when they agree."""
    order, allowed = table[0], table[1]
    shown = os.path.basename(doc_path)
    rows = read_doc_table(doc_path)
    if rows is None:
        return [f'{shown}: no table headed "| module | may include |"']
    listed = [module for module, _ in rows]
    problems = []
    for i in range(max(len(order), len(listed))):
        ours = order[i] if i < len(order) else None
        theirs = listed[i] if i < len(listed) else None
        if ours == theirs:
            continue
        if theirs is None or ours not in listed:
            problems.append(f'{shown}: the table lacks {ours}, row {i + 1} of LAYERS')
        elif ours is None or theirs not in order:
            problems.append(f'{shown}: the table has {theirs} (row {i + 1}), which LAYERS has not')
        else:
            problems.append(f'{shown}: the table has {theirs} at row {i + 1} where LAYERS has '
                            f'{ours}: the order differs')
        break                       # past the first, every row would differ
    for module, deps in rows:
        if module in allowed and set(deps) != allowed[module]:
            row = ' '.join(sorted(allowed[module], key=order.index)) or '-'
            problems.append(f'{shown}: the table says {module} may include '
                            f'"{" ".join(deps) or "-"}", LAYERS "{row}"')
    return problems


def module_of(root, path):
    rel = os.path.relpath(path, root)
    return 'main' if os.sep not in rel else rel.split(os.sep, 1)[0]


def source_files(root):
    for folder, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(files):
            if name.endswith(SOURCES):
                yield os.path.join(folder, name)


def check_tree(root, table):
    """Returns (broken, edges, folders): broken maps a module to the rules its files
    break ("file:line: ..."), edges the module graph the includes make."""
    order, allowed, libs, _, private = table
    broken = {m: [] for m in order}
    edges = {m: set() for m in order}
    folders = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
    for path in source_files(root):
        module = module_of(root, path)
        shown = os.path.relpath(path, os.path.dirname(root))
        if module not in allowed:
            broken.setdefault(module, []).append(f'{shown}: the folder {module} has no row in LAYERS')
            continue
        with open(path, errors='replace') as f:
            for number, line in enumerate(f, 1):
                m = INCLUDE.match(line)
                if not m:
                    continue
                kind, name = m.groups()
                where = f'{shown}:{number}: #include {kind}{name}{">" if kind == "<" else kind}'
                if kind == '<':
                    owner = libs.get(name)
                    if owner is not None and owner != module:
                        broken[module].append(f'{where}: only {owner} may include {name}')
                    continue
                if '/' not in name:
                    if not os.path.exists(os.path.join(os.path.dirname(path), name)):
                        broken[module].append(f'{where}: no such file in its folder')
                    continue
                target = name.split('/', 1)[0]
                if target == module:
                    broken[module].append(f'{where}: a file of the same folder is included '
                                          f'by its bare name')
                    continue
                if target not in allowed or target == 'main':
                    broken[module].append(f'{where}: {target} is no module')
                    continue
                if not os.path.exists(os.path.join(root, name)):
                    broken[module].append(f'{where}: no such file')
                    continue
                edges[module].add(target)
                if PRIVATE.search(name) or name in private:
                    broken[module].append(f'{where}: private to {target}')
                if target not in allowed[module]:
                    may = ' '.join(sorted(allowed[module], key=order.index)) or 'nothing'
                    broken[module].append(f'{where}: {module} may not include {target} '
                                          f'(LAYERS: {module} may include {may})')
    for folder in folders:
        if folder not in allowed:
            broken.setdefault(folder, []).append(f'server/{folder}: the folder has no row in LAYERS')
    return broken, edges


def shortest_path(edges, start, goal):
    """The shortest list of modules from start to goal along edges, or None."""
    parent, frontier = {start: None}, [start]
    while frontier and goal not in parent:
        following = []
        for here in frontier:
            for n in sorted(edges.get(here, ())):
                if n not in parent:
                    parent[n] = here
                    following.append(n)
        frontier = following
    if goal not in parent:
        return None
    path = [goal]
    while parent[path[0]] is not None:
        path.insert(0, parent[path[0]])
    return path


def find_circles(edges, allowed):
    """The circles of the module graph, one for each include the table does not allow
    that closes one (as the table allows no circle, every circle has such an include):
    lists of modules, first == last."""
    circles = []
    for a in sorted(edges):
        for b in sorted(edges[a]):
            if b in allowed.get(a, ()):
                continue
            back = shortest_path(edges, b, a)
            if back is not None:
                circles.append([a] + back)
    return circles


class Report:
    def __init__(self, pattern):
        self.pattern, self.passed, self.failed = pattern, 0, 0

    def wanted(self, name):
        return self.pattern is None or self.pattern in name

    def check(self, name, problems):
        if not self.wanted(name):
            return
        if problems:
            self.failed += 1
            print(f'FAIL {name}')
            for p in problems:
                print(f'     {p}')
        else:
            self.passed += 1
            print(f'ok   {name}')


def verdict(root, table_path):
    """Every problem the tree at root has, in one list (for the planted faults)."""
    table = read_table(table_path)
    broken, edges = check_tree(root, table)
    problems = table[3] + [p for m in broken for p in broken[m]]
    problems += ['circle: ' + ' -> '.join(c) for c in find_circles(edges, table[1])]
    return problems


def plant(root, table_path, relpath, include, expect):
    """Copies the tree, appends include to relpath there and returns the problems that
    do not contain every string of expect (empty when the check caught it)."""
    scratch = tempfile.mkdtemp(prefix='layers-check-')
    try:
        copy = os.path.join(scratch, 'server')
        shutil.copytree(root, copy, ignore=shutil.ignore_patterns('page'))
        with open(os.path.join(copy, relpath), 'a') as f:
            f.write(f'\n#include "{include}"\n')
        problems = verdict(copy, os.path.join(copy, os.path.basename(table_path)))
        caught = [p for p in problems if all(e in p for e in expect)]
        return [] if caught else [f'planting #include "{include}" in {relpath} was not '
                                  f'reported as {expect}; reported: {problems}']
    finally:
        if os.path.dirname(scratch) == tempfile.gettempdir() and 'layers-check-' in scratch:
            shutil.rmtree(scratch)


def plant_doc(doc_path, table, mutate, expect):
    """Copies doc_path, changes its module table's rows with mutate (a function of
    the list of row lines) and returns the problems unless compare_doc reported one
    containing every string of expect."""
    scratch = tempfile.mkdtemp(prefix='layers-check-')
    try:
        with open(doc_path) as f:
            lines = f.readlines()
        header = next(i for i, line in enumerate(lines)
                      if [c.strip() for c in line.strip().strip('|').split('|')] ==
                      ['module', 'may include'])
        first = header + 2          # past the line under the header
        last = next((i for i in range(first, len(lines)) if not TABLE_ROW.match(lines[i].strip())),
                    len(lines))
        lines[first:last] = mutate(lines[first:last])
        copy = os.path.join(scratch, os.path.basename(doc_path))
        with open(copy, 'w') as f:
            f.writelines(lines)
        problems = compare_doc(copy, table)
        caught = [p for p in problems if all(e in p for e in expect)]
        return [] if caught else [f'changing the table of {doc_path} was not reported as '
                                  f'{expect}; reported: {problems}']
    finally:
        if os.path.dirname(scratch) == tempfile.gettempdir() and 'layers-check-' in scratch:
            shutil.rmtree(scratch)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser()
    parser.add_argument('--root', default=os.path.join(here, '..', '..', 'server'))
    parser.add_argument('--design', default=os.path.join(here, '..', '..', 'docs', 'design.md'))
    parser.add_argument('--filter', default=None)
    args = parser.parse_args()
    root = os.path.normpath(args.root)
    table_path = os.path.join(root, 'LAYERS')
    report = Report(args.filter)

    table = read_table(table_path)
    report.check('layers: the table', table[3])
    broken, edges = check_tree(root, table)
    for module in table[0]:
        report.check(f'layers: {module}', broken.pop(module, []))
    for module, problems in broken.items():
        report.check(f'layers: {module}', problems)
    report.check('layers: no circle between modules',
                 ['circle: ' + ' -> '.join(c) for c in find_circles(edges, table[1])])
    design = os.path.normpath(args.design)
    report.check('layers: the table of docs/design.md is LAYERS', compare_doc(design, table))

    # The check itself, on planted faults: each must be reported where it is.
    planted = [
        ('layers: a planted upward include is reported', 'core/error.h', 'http/http.h',
         ['core/error.h', 'core may not include http']),
        ('layers: a planted circle is reported', 'store/store.h', 'request/weights_json.h',
         ['circle: ', 'request', 'store']),
        ('layers: a planted include of a private header is reported', 'v2/v2.c',
         'store/store_internal.h', ['v2/v2.c', 'private to store']),
        ('layers: a planted include of a header a private: row names is reported',
         'request/admission.c', 'kernel/attention_fused.h',
         ['request/admission.c', 'private to kernel']),
        ('layers: a planted include of a missing header is reported', 'json/jsonw.c',
         'core/nowhere.h', ['json/jsonw.c', 'no such file']),
    ]
    for name, relpath, include, expect in planted:
        if report.wanted(name):
            report.check(name, plant(root, table_path, relpath, include, expect))
    # The rows are those of LAYERS (the check above): the second one left out must be
    # named, and the first two swapped must be reported as an order.
    second, first = table[0][1], table[0][0]
    planted_doc = [
        ('layers: a module missing from design.md\'s table is reported',
         lambda rows: rows[:1] + rows[2:], [f'lacks {second}']),
        ('layers: two modules swapped in design.md\'s table are reported',
         lambda rows: [rows[1], rows[0]] + rows[2:], [f'has {second} at row 1', 'order']),
    ]
    for name, mutate, expect in planted_doc:
        if report.wanted(name):
            report.check(name, plant_doc(design, table, mutate, expect))

    print(f'{report.passed} passed, {report.failed} failed')
    return 1 if report.failed else 0


if __name__ == '__main__':
    sys.exit(main())
