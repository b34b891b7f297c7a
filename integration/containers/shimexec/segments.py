#!/usr/bin/env python3
"""Where the time of a `ctr run --rm ... true` goes, shim execution by shim execution, per runtime.

Input: `perf script` output of a system-wide trace taken over BenchmarkStartPaired
(perf record -a -e sched:sched_process_exec,sched:sched_process_exit,sched:sched_process_fork) and the benchmark's
start order (go run ./integration/containers/shimexec/order PAIRS KINDS). For every measured ctr it finds the three
executions of the shim binary containerd makes (`start`, which execs the serving shim; the serving shim; `delete`),
the runc executions of each, and prints the median of every gap between those events per runtime, and each
runtime's median minus runc's:

    python3 integration/containers/shimexec/segments.py PERF_SCRIPT_TXT ORDER_TXT
"""
import collections
import re
import statistics
import sys

NAMES = {0: 'runc', 1: 'shim-noquota', 2: 'detshare-quota', 3: 'reference'}
EV = re.compile(r'^\s*(.+?)\s+(\d+)\s+\[\d+\]\s+([\d.]+):\s+([\w:]+):\s*(.*)$')


def load(path):
    parent, execs, exits = {}, {}, {}
    for line in open(path):
        m = EV.match(line)
        if not m:
            continue
        pid, t, ev, rest = int(m.group(2)), float(m.group(3)) * 1000, m.group(4), m.group(5)
        if ev == 'sched:sched_process_fork':
            parent[int(re.search(r'child_pid=(\d+)', rest).group(1))] = pid
        elif ev == 'sched:sched_process_exec':
            execs[pid] = (t, re.search(r'filename=(\S+)', rest).group(1))
        elif ev == 'sched:sched_process_exit':
            exits[int(re.search(r'(?:^| )pid=(\d+)', rest).group(1))] = t
    return parent, execs, exits


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    parent, execs, exits = load(sys.argv[1])
    order = [int(x) for x in open(sys.argv[2]) if x.strip()]

    def owner(pid):  # the nearest ancestor task that exec'd: the program that started pid
        p, n = parent.get(pid), 0
        while p is not None and p not in execs and n < 64:
            p, n = parent.get(p), n + 1
        return p

    kids = collections.defaultdict(list)
    for q in execs:
        o = owner(q)
        if o is not None:
            kids[o].append(q)
    for o in kids:
        kids[o].sort(key=lambda q: execs[q][0])
    byt = sorted(execs, key=lambda q: execs[q][0])
    is_shim = lambda q: 'containerd-shim' in execs[q][1]
    runs = []
    for c in (q for q in byt if execs[q][1].endswith('/ctr') and q in exits):
        shims = [s for s in byt if is_shim(s) and execs[c][0] <= execs[s][0] <= exits[c]]
        if shims:
            runs.append((c, shims))
    if len(runs) < len(order):
        sys.exit(f'segments: {len(runs)} ctr runs with a shim in the trace, the order names {len(order)}')
    runs = runs[-len(order):]  # the warm-up starts come first
    seg = collections.defaultdict(lambda: collections.defaultdict(list))
    for (c, shims), kind in zip(runs, order):
        top = [s for s in shims if owner(s) is None or not is_shim(owner(s))]
        start, delete = top[0], top[-1]
        serve = next(s for s in shims if owner(s) == start)
        sr = [q for q in kids[serve] if execs[q][1].endswith('/runc')]
        dr = [q for q in kids[delete] if execs[q][1].endswith('/runc')]
        if len(sr) != 3 or len(dr) != 1:
            sys.exit(f'segments: ctr pid {c}: {len(sr)} runc executions by the serving shim (want 3: create, start, '
                     f'delete) and {len(dr)} by delete (want 1)')
        pts = [('ctr exec', execs[c][0]), ('start exec', execs[start][0]), ('serve exec', execs[serve][0]),
               ('start exit', exits[start]), ('runc create exec', execs[sr[0]][0]), ('runc create exit', exits[sr[0]]),
               ('runc start exec', execs[sr[1]][0]), ('runc start exit', exits[sr[1]]),
               ('runc delete exec', execs[sr[2]][0]), ('runc delete exit', exits[sr[2]]), ('serve exit', exits[serve]),
               ('delete exec', execs[delete][0]), ('delete: runc exec', execs[dr[0]][0]),
               ('delete: runc exit', exits[dr[0]]), ('delete exit', exits[delete]), ('ctr exit', exits[c])]
        for (a, ta), (b, tb) in zip(pts, pts[1:]):
            seg[kind][f'{a} -> {b}'].append(tb - ta)
        seg[kind]['total (ctr exec -> exit)'].append(exits[c] - execs[c][0])
        seg[kind]['start process: exec -> exit'].append(exits[start] - execs[start][0])
        seg[kind]['serving shim: exec -> runc create exec'].append(execs[sr[0]][0] - execs[serve][0])
        seg[kind]['delete process: exec -> exit'].append(exits[delete] - execs[delete][0])
    kinds = sorted(seg)
    med = statistics.median
    print(f"{'P50, ms':42s}" + ''.join(f'{NAMES[k]:>16s}' for k in kinds) +
          ''.join(f"{NAMES[k] + ' - runc':>24s}" for k in kinds if k))
    for key in seg[kinds[0]]:
        print(f'{key:42s}' + ''.join(f'{med(seg[k][key]):16.2f}' for k in kinds) +
              ''.join(f'{med(seg[k][key]) - med(seg[0][key]):24.2f}' for k in kinds if k))
    print('starts:', ', '.join(f'{NAMES[k]} {len(seg[k]["total (ctr exec -> exit)"])}' for k in kinds))


if __name__ == '__main__':
    main()
