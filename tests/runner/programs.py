"""Worker programs the tests run in real sandboxes (python3 -I -c SOURCE ARGS...)."""

from __future__ import annotations

from charter.control import WorkerSpec

PY = "/usr/bin/python3"

PRELUDE = "import sys, json; sys.path.insert(0, '/workspace'); import charter_door\n"

COST = {"wall_ms": 60_000, "cpu_ms": 60_000, "mem_bytes": 1 << 20, "egress_bytes": 0}

# Fans out argv[1] children that echo their number, waits, and answers with the sum.
COORDINATOR = (
    PRELUDE
    + f"""
width = int(sys.argv[1])
door = charter_door.Door()
kids = door.spawn({{"width": width, "objective": "echo numbers",
                   "estimated_cost": {{"tokens": 10_000 * width, **{COST!r}}}}},
                  [{{"argv": ["/bin/echo", str(i)]}} for i in range(width)])["children"]
answers = door.wait(kids, 120)["children"]
total = sum(int(answers[k]["result"]) for k in kids)
statuses = sorted({{answers[k]["status"] for k in kids}})
door.result(json.dumps({{"sum": total, "statuses": statuses}}))
"""
)

# Fans out one child per level, argv[1] levels deep; the leaf echoes "leaf".
CHAIN = (
    PRELUDE
    + f"""
levels = level_s = int(sys.argv[1])
door = charter_door.Door()
if levels == 0:
    door.result("leaf")
    sys.exit(0)
src = open('/proc/self/cmdline', 'rb').read().split(b'\\0')[3].decode()
kids = door.spawn({{"width": 1,
                   "objective": "recurse one level deeper and report the answer of the leaf",
                   "grant": {{"fanout": level_s - 1}},
                   "estimated_cost": {{"tokens": 10_000 * levels, **{COST!r}}}}},
                  [{{"argv": ["{PY}", "-I", "-c", src, str(levels - 1)]}}])["children"]
answers = door.wait(kids, 120)["children"]
door.result(answers[kids[0]]["result"] + "<" + str(levels))
"""
)


def python(source: str, *args: str) -> WorkerSpec:
    return WorkerSpec(argv=(PY, "-I", "-c", source), inputs=args)


# Spawns a child LINGER(level - 1) and waits on it for ever; the leaf sleeps.
LINGER = (
    PRELUDE
    + f"""
level = level_s = int(sys.argv[1])
if level == 0:
    import time
    time.sleep(600)
door = charter_door.Door()
src = open('/proc/self/cmdline', 'rb').read().split(b'\\0')[3].decode()
kids = door.spawn({{"width": 1,
                   "objective": "spawn one child below and wait for its answer",
                   "grant": {{"fanout": level_s - 1}},
                   "estimated_cost": {{"tokens": 10_000 * level, **{COST!r}}}}},
                  [{{"argv": ["{PY}", "-I", "-c", src, str(level - 1), sys.argv[2]]}}])["children"]
door.wait(kids, float(sys.argv[2]))
door.result("gave up waiting")
"""
)
