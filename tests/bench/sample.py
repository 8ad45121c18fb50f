"""sample.py - how busy is a server, and is it oversubscribed?  Samples /proc while load runs.

Usage: python3 sample.py SECONDS PID...
Every 10 ms for SECONDS it counts the threads of the given processes (and their children) that
are running or runnable (state R), and at the end prints one line:
  cpu_s=X wall_s=X cores_busy=X runnable_mean=X runnable_max=N threads_max=N
cpu_s is the user + system time the processes used during the window (from /proc/PID/stat of
each, children included as they were seen), cores_busy = cpu_s / wall_s. A runnable count above
the number of cores means threads of the server wait for one another's cores: oversubscription.
"""

import os
import sys
import time

TICK = os.sysconf("SC_CLK_TCK")


def tree(pids):
    seen, todo = [], list(pids)
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except OSError:
            pass
    return seen


def cpu_ticks(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])  # utime, stime
    except OSError:
        return 0


def sample(pids):
    runnable = threads = 0
    for p in pids:
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for t in tasks:
            try:
                with open(f"/proc/{p}/task/{t}/stat") as f:
                    state = f.read().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            threads += 1
            runnable += state == "R"
    return runnable, threads


def main():
    seconds = float(sys.argv[1])
    roots = [int(p) for p in sys.argv[2:]]
    pids = tree(roots)
    start_ticks = {p: cpu_ticks(p) for p in pids}
    t0 = time.monotonic()
    counts, tmax = [], 0
    while time.monotonic() - t0 < seconds:
        r, t = sample(pids)
        counts.append(r)
        tmax = max(tmax, t)
        time.sleep(0.01)
    wall = time.monotonic() - t0
    cpu = sum(cpu_ticks(p) - start_ticks.get(p, 0) for p in pids) / TICK
    mean = sum(counts) / len(counts) if counts else 0
    print(f"cpu_s={cpu:.2f} wall_s={wall:.2f} cores_busy={cpu / wall:.2f} "
          f"runnable_mean={mean:.2f} runnable_max={max(counts or [0])} threads_max={tmax}")


if __name__ == "__main__":
    main()
