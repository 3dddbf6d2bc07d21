"""Worker programs the tests run in real sandboxes (python3 -I -c SOURCE ARGS...)."""

from __future__ import annotations

from charter.control import WorkerSpec

PY = "/usr/bin/python3"

PRELUDE = "import sys, json; sys.path.insert(0, '/workspace'); import charter_door\n"

# What a worker program was told: "ok", or the reason code of the door's refusal.
REASON = """
def reason(f):
    try:
        f()
        return "ok"
    except charter_door.DoorError as e:
        return (e.data or {}).get("reason")
"""

# A door call made on ``door`` (this program's connection), made again on a new one
# after some work of the worker's own while the door refuses it for having served this
# worker more than its CPU allowance (-32002, docs/door.md: such a frame was never
# parsed, so a retry is safe, and the door closed that connection). A coordinator that
# mostly waits does little work of its own, and a loaded host makes each call dearer.
WORKED = """
import time
door = charter_door.Door()
def worked(f, tries=200):
    global door
    for _ in range(tries):
        try:
            return f(door)
        except charter_door.DoorError as e:
            if e.code != -32002:
                raise
        door.close()
        spent = time.process_time()
        while time.process_time() - spent < 0.2:
            pass
        door = charter_door.Door()
    return f(door)
"""

# Children run under their leases: each needs at least the sandbox minimum of memory.
COST = {"wall_ms": 60_000, "cpu_ms": 60_000, "mem_bytes": 1 << 28, "egress_bytes": 0}

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

# Asks its door for children by cell and by class; reports each outcome as "ok" (and
# where the child was scheduled: its lineage) or [code, reason]. argv[1]: a class its
# cell has; argv[2]: a class no live cell has.
CLASS_ASKER = (
    PRELUDE
    + f"""
door = charter_door.Door()
out = {{}}
def code(f):
    try:
        return ["ok", f()["children"]]
    except charter_door.DoorError as e:
        return [e.code, (e.data or {{}}).get("reason")]
intent = {{"width": 1, "objective": "run one child on a cell of the class asked",
          "estimated_cost": {{"tokens": 10_000, **{COST!r}}}}}
def ask(**worker):
    return code(lambda: door.spawn(intent, [{{"argv": ["/bin/true"], **worker}}]))
out["names_cell"] = ask(cell="other")
out["names_cell_and_class"] = ask(cell="other", cell_class=sys.argv[1])
out["asks_bad_class"] = ask(cell_class="Not A Class")
out["asks_missing_class"] = ask(cell_class=sys.argv[2])
out["asks_class"] = ask(cell_class=sys.argv[1])
door.wait(out["asks_class"][1], 60) if out["asks_class"][0] == "ok" else None
print(json.dumps(out))
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

# Tries what a worker must not be able to do through its door; reports each outcome as
# "ok" or [code, reason]. argv[1]: the door's frame cap; argv[2]: a sibling's lineage.
ATTACKER = (
    PRELUDE
    + f"""
import socket
frame_cap, sibling = int(sys.argv[1]), sys.argv[2]
door = charter_door.Door()
out = {{}}
def code(f):
    try:
        f()
        return "ok"
    except charter_door.DoorError as e:
        return [e.code, (e.data or {{}}).get("reason")]
def raw(payload):
    s = socket.socket(socket.AF_UNIX)
    s.connect(charter_door.DEFAULT_PATH)
    s.sendall(payload)
    f = s.makefile("rb")
    first = f.readline()
    return s, f, json.loads(first) if first else None
me = door.whoami()["lineage"]
out["whoami"] = me
cost = {{"tokens": 10_000, **{COST!r}}}
intent = {{"width": 1, "objective": "echo a number and report it back to the coordinator",
          "estimated_cost": cost}}
true = [{{"argv": ["/bin/true"]}}]
out["intent_names_lineage"] = code(lambda: door.call(
    "spawn", {{"intent": {{**intent, "lineage": "agent:estate"}}, "workers": true}}))
out["params_name_parent"] = code(lambda: door.call(
    "spawn", {{"intent": intent, "workers": true, "parent": "agent:estate"}}))
out["worker_names_cell"] = code(lambda: door.call(
    "spawn", {{"intent": intent, "workers": [{{"argv": ["/bin/true"], "cell": "other"}}]}}))
s, f, reply = raw(json.dumps({{"jsonrpc": "2.0", "id": 1, "method": "whoami",
                               "caller": sibling}}).encode() + b"\\n")
out["envelope_names_caller"] = reply["error"]["code"]
s.close()
out["wait_on_sibling"] = code(lambda: door.wait([sibling], 1))
out["over_budget"] = code(lambda: door.spawn(
    {{**intent, "estimated_cost": {{**cost, "tokens": 10**12}}}}, true))
out["over_fanout"] = code(lambda: door.spawn({{**intent, "width": 50}}, true))
out["valid_spawn"] = code(lambda: door.spawn(intent, [{{"argv": ["/bin/echo", "7"]}}]))
out["result_too_big"] = code(lambda: door.result("x" * (64 * 1024 + 1)))
s, f, reply = raw(b"{{not json\\n")
out["malformed"] = reply["error"]["code"]
s.sendall(json.dumps({{"jsonrpc": "2.0", "id": 2, "method": "whoami"}}).encode() + b"\\n")
out["after_malformed"] = json.loads(f.readline())["result"]["lineage"]
s.close()
s, f, reply = raw(b"x" * (frame_cap + 10) + b"\\n")
out["oversized"] = reply["error"]["code"]
out["oversized_closed"] = f.readline() == b""
s.close()
held = [raw(b"")[0] if False else socket.socket(socket.AF_UNIX) for _ in range(6)]
refused = 0
for c in held:
    c.connect(charter_door.DEFAULT_PATH)
    c.settimeout(0.5)
    try:
        data = c.recv(4096)
    except socket.timeout:
        data = b""
    if data and json.loads(data)["error"]["code"] == -32001:
        refused += 1
out["connections_refused"] = refused
for c in held:
    c.close()
sig = door.sign("demo/v1", b"hello")
out["signature"] = sig.hex()
over = 0
for i in range(400):
    try:
        door.whoami()
    except charter_door.DoorError as e:
        over += e.code == -32001
        break
out["flood_capped"] = over
print(json.dumps(out))
"""
)

# Asks who it is n times over a while (the flood next door must not stop it).
BYSTANDER = (
    PRELUDE
    + """
import time
door = charter_door.Door()
names = set()
for _ in range(int(sys.argv[1])):
    names.add(door.whoami()["lineage"])
    time.sleep(0.02)
print(json.dumps(sorted(names)))
"""
)

# Answers with its own lineage through the door, then lingers until killed.
WHOAMI_AND_LINGER = (
    PRELUDE
    + """
import time
door = charter_door.Door()
door.result(door.whoami()["lineage"])
time.sleep(120)
"""
)

# Asks the door at argv[1] who it is (run on the host, as a worker's uid); prints the
# error code and message, or the lineage.
ASK_DOOR = """
import sys
sys.path.insert(0, sys.argv[2])
import client
try:
    print("ok", client.Door(sys.argv[1], timeout=10).whoami()["lineage"])
except client.DoorError as e:
    print("refused", e.code, e.message)
"""

# Speaks raw JSON-RPC to its door from inside its sandbox (issue 23, points 4 and 8):
# a lone surrogate, ids that are not JSON-RPC ids, a missing method, a batch, a
# notification; reports what came back as its result, given by a notification (so the
# journaled result is itself the proof that a notification is executed). Strict JSON
# only: a NaN or Infinity in a reply is an error here.
PROTOCOL = (
    PRELUDE
    + """
import socket
s = socket.socket(socket.AF_UNIX)
s.connect(charter_door.DEFAULT_PATH)
s.settimeout(30)
f = s.makefile("rb")
def refuse(name):
    raise ValueError(name + " is not JSON")
def ask(frame):
    s.sendall(frame.encode() + b"\\n")
    return json.loads(f.readline(), parse_constant=refuse)
out = {}
r = ask('{"jsonrpc": "2.0", "method": "result", "params": {"text": "\\\\ud800"}, "id": 1}')
out["surrogate"] = [r["error"]["code"], r["id"]]
out["after_surrogate"] = ask('{"jsonrpc": "2.0", "method": "whoami", "id": 2}')["result"]
for name, rid in (("huge_id", "1e400"), ("nan_id", "NaN")):
    r = ask('{"jsonrpc": "2.0", "method": "whoami", "id": ' + rid + '}')
    out[name] = [r["error"]["code"], r["id"]]
r = ask('{"jsonrpc": "2.0", "id": 3}')
out["no_method"] = [r["error"]["code"], r["id"]]
r = ask('[{"jsonrpc": "2.0", "method": "whoami", "id": 4}, {"jsonrpc": "2.0", "method": "x"},'
        ' {"jsonrpc": "2.0", "method": "whoami", "id": 5}]')
out["batch"] = sorted(x["id"] for x in r)
s.sendall(b'{"jsonrpc": "2.0", "method": "whoami"}\\n')  # a notification: no reply
out["after_notification"] = ask('{"jsonrpc": "2.0", "method": "whoami", "id": 6}')["id"]
s.sendall(json.dumps({"jsonrpc": "2.0", "method": "result",
                      "params": {"text": json.dumps(out)}}).encode() + b"\\n")
s.sendall(b'{"jsonrpc": "2.0", "method": "whoami", "id": 7}\\n')  # waits for the result
assert json.loads(f.readline())["id"] == 7
print("not the result: the notification gave it")
"""
)
