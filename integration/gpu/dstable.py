#!/usr/bin/env python3
"""dstable: a test fixture that writes DetShare's shared-memory table from Python, to move grants ON PURPOSE.

It is not a scheduler and must not register the benchmark's tenants: bench.py runs the real `detshare sched` and
`detshare run`. What it is kept for is what a real scheduler will not do: publish a grant the test chooses, when it
chooses. conformance.sh and determinism.py force a grant change every few milliseconds (GrantChanger) to show that
results stay bit-identical and kernels stay confined while grants move under a tenant; rebind.py flips one tenant
between two group sets to time the rebind; memquota.py registers one tenant with a memory quota and a full grant.
Each of them keeps the table's leader alive with a heartbeat (Heartbeat; GrantChanger beats too). The Go tests use
its CLI and Layout to check that this writer and internal/table agree (TestPythonTableMatchesGoMirror).

It creates the table, the doorbell, client pages and quota files in a run directory (docs/internals.md "Run
directory"), registers tenants and publishes grants with the seqlock protocol of
internal/table/detshare_table.h. The layout is NOT copied here:
it is computed by parsing that header (field types, array lengths, #define constants) and checked against the
offset comments and the _Static_assert sizes in it, so a layout change there either flows through or fails loudly.

Library use:   t = Table.create(run_dir, sm_count=132, group_sms=8, mps_pipe_dir=...)
               q = t.register("lc", tier="latency-critical", groups=0b1111, mem_limit=0)
               t.publish_grant(q.slot, groups)
CLI:           dstable.py --help
Only the standard library is used (struct, mmap, ctypes for futex wakes), so it runs anywhere python3 does.
"""
import argparse
import ctypes
import mmap
import os
import re
import struct
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_HEADER = os.path.normpath(os.path.join(HERE, "..", "..", "internal", "table", "detshare_table.h"))

# C scalar types the header uses: (struct code, size). Native byte order: the table is little-endian and we
# refuse to run elsewhere (see _check_host).
_CTYPES = {"uint8_t": ("B", 1), "char": ("c", 1), "uint32_t": ("I", 4), "int32_t": ("i", 4), "uint64_t": ("Q", 8)}


class LayoutError(Exception):
    """The header could not be parsed, or the computed layout disagrees with the header's own assertions."""


def _check_host():
    if sys.byteorder != "little":
        raise LayoutError("the DetShare table is little-endian; this host is %s-endian" % sys.byteorder)


def _strip_comments(src):
    return re.sub(r"/\*.*?\*/", " ", src, flags=re.S)


def _c_int(expr, defines):
    """Evaluates a C integer constant expression made of literals, #defines, sizeof(struct x) and + - * / ( )."""
    e = re.sub(r"\b(0x[0-9a-fA-F]+|\d+)[uUlL]+\b", r"\1", expr)
    e = re.sub(r"sizeof\s*\(\s*struct\s+(\w+)\s*\)", lambda m: str(defines["sizeof:" + m.group(1)]), e)
    e = re.sub(r"\b([A-Z_][A-Z0-9_]*)\b", lambda m: str(defines[m.group(1)]) if m.group(1) in defines else m.group(0), e)
    if not re.fullmatch(r"[0-9a-fA-Fx+\-*/()<> \t]*", e):
        raise LayoutError("cannot evaluate %r (became %r)" % (expr, e))
    return int(eval(e.replace("/", "//"), {"__builtins__": {}}))  # noqa: S307 - digits and operators only


class Field:
    __slots__ = ("name", "ctype", "count", "offset", "size", "align", "struct")

    def __repr__(self):
        return "Field(%s %s[%d] @%d)" % (self.ctype, self.name, self.count, self.offset)


class Struct:
    def __init__(self, name):
        self.name, self.fields, self.size, self.align = name, {}, 0, 1

    def off(self, field):
        return self.fields[field].offset


class Layout:
    """Struct layouts and constants parsed from detshare_table.h."""

    def __init__(self, header=DEFAULT_HEADER):
        _check_host()
        with open(header) as f:
            raw = f.read()
        self.header = header
        self.defines = {}
        self.structs = {}
        self._parse_defines(raw)
        self._parse_enums(raw)
        self._parse_structs(raw)
        self._check_asserts(raw)

    def _parse_defines(self, raw):
        for m in re.finditer(r"^#define\s+(DS_\w+)\s+(.+?)\s*(?:/\*.*)?$", raw, flags=re.M):
            name, val = m.group(1), m.group(2)
            try:
                self.defines[name] = _c_int(val, self.defines)
            except (LayoutError, KeyError, SyntaxError):
                continue  # DS_CONTAINERS_OFFSET etc. may need sizes: retried after the structs

    def _parse_enums(self, raw):
        for body in re.findall(r"enum\s*\{(.*?)\}", _strip_comments(raw), flags=re.S):
            for item in body.split(","):
                m = re.match(r"\s*(DS_\w+)\s*=\s*(.+?)\s*$", item, flags=re.S)
                if m:
                    self.defines[m.group(1)] = _c_int(m.group(2), self.defines)

    def _parse_structs(self, raw):
        for m in re.finditer(r"struct\s+(\w+)\s*\{(.*?)\n\};", raw, flags=re.S):
            st = Struct(m.group(1))
            off = 0
            # comments spanning lines are prose; single-line ones may carry the offset this parser checks
            body = re.sub(r"/\*(?:(?!\*/).)*\n(?:.|\n)*?\*/", " ", m.group(2))
            for line in body.splitlines():
                comment = re.search(r"/\*\s*(\d+)\b", line)
                decl = _strip_comments(line).strip()
                if not decl:
                    continue
                fm = re.fullmatch(r"(struct\s+\w+|\w+)\s+(\w+)\s*(?:\[(.+?)\])?\s*;", decl)
                if not fm:
                    raise LayoutError("%s: cannot parse field %r in struct %s" % (self.header, decl, st.name))
                f = Field()
                f.ctype, f.name = fm.group(1), fm.group(2)
                f.count = _c_int(fm.group(3), self.defines) if fm.group(3) else 1
                if f.ctype.startswith("struct "):
                    sub = self.structs[f.ctype.split()[1]]
                    f.struct, f.size, f.align = sub, sub.size, sub.align
                else:
                    if f.ctype not in _CTYPES:
                        raise LayoutError("%s: unknown type %s of %s.%s" % (self.header, f.ctype, st.name, f.name))
                    f.struct, f.size = None, _CTYPES[f.ctype][1]
                    f.align = f.size
                off = (off + f.align - 1) // f.align * f.align
                f.offset = off
                if comment and int(comment.group(1)) != off:
                    raise LayoutError("%s: %s.%s computed at offset %d, header comment says %s"
                                      % (self.header, st.name, f.name, off, comment.group(1)))
                off += f.size * f.count
                st.align = max(st.align, f.align)
                st.fields[f.name] = f
            st.size = (off + st.align - 1) // st.align * st.align
            self.structs[st.name] = st
            self.defines["sizeof:" + st.name] = st.size
        # constants that depend on sizes
        self._parse_defines(raw)

    def _check_asserts(self, raw):
        n = 0
        for m in re.finditer(r"_Static_assert\((.+?)\s*==\s*(.+?),\s*\"", raw):
            got, want = _c_int(m.group(1), self.defines), _c_int(m.group(2), self.defines)
            if got != want:
                raise LayoutError("%s: %s is %d here, the header asserts %d" % (self.header, m.group(1), got, want))
            n += 1
        if n < 6:
            raise LayoutError("%s: expected the 6 size assertions, found %d" % (self.header, n))
        for k in ("DS_TABLE_MAGIC", "DS_CLIENT_MAGIC", "DS_DOORBELL_MAGIC", "DS_TABLE_ABI_VERSION",
                  "DS_GPUS_OFFSET", "DS_CONTAINERS_OFFSET", "DS_TABLE_SIZE"):
            if k not in self.defines:
                raise LayoutError("%s: #define %s not found" % (self.header, k))

    def __getitem__(self, name):
        return self.defines[name]


class Region:
    """A struct at a fixed offset of a mapping; scalar loads/stores are single aligned accesses (native format
    through ctypes), which on x86-64 and arm64 are atomic for naturally aligned 4- and 8-byte words."""

    def __init__(self, mm, base, st):
        self.mm, self.base, self.st = mm, base, st

    def _f(self, name):
        try:
            return self.st.fields[name]
        except KeyError:
            raise LayoutError("struct %s has no field %s" % (self.st.name, name)) from None

    def addr(self, name, index=0):
        f = self._f(name)
        return self.base + f.offset + index * f.size

    def _cobj(self, name, index=0):
        f = self._f(name)
        ct = {"B": ctypes.c_uint8, "I": ctypes.c_uint32, "i": ctypes.c_int32, "Q": ctypes.c_uint64}[_CTYPES[f.ctype][0]]
        return ct.from_buffer(self.mm, self.addr(name, index))

    def get(self, name, index=0):
        try:
            return self._cobj(name, index).value
        except TypeError:  # a read-only mapping: a plain native-width load
            return struct.unpack_from("@" + _CTYPES[self._f(name).ctype][0], self.mm, self.addr(name, index))[0]

    def set(self, name, value, index=0):
        self._cobj(name, index).value = value

    def add(self, name, delta=1):
        o = self._cobj(name)
        o.value = o.value + delta
        return o.value

    def set_str(self, name, s):
        f = self._f(name)
        b = s.encode()
        if len(b) >= f.count:
            raise ValueError("%s: %r is %d bytes, at most %d fit" % (name, s, len(b), f.count - 1))
        a = self.addr(name)
        self.mm[a:a + f.count] = b + b"\0" * (f.count - len(b))

    def get_str(self, name):
        f = self._f(name)
        a = self.addr(name)
        return bytes(self.mm[a:a + f.count]).split(b"\0", 1)[0].decode()

    def sub(self, name, index):
        f = self._f(name)
        return Region(self.mm, self.addr(name, index), f.struct)

    def ptr(self, name):
        return ctypes.addressof(self._cobj(name))


_libc = None


def futex_wake(addr):
    """FUTEX_WAKE all waiters on a shared word (best effort: a waiter also re-checks on its timeout)."""
    global _libc
    try:
        if _libc is None:
            _libc = ctypes.CDLL(None, use_errno=True)
        nr = {"x86_64": 202, "aarch64": 98}.get(os.uname().machine)
        if nr is not None:
            _libc.syscall(ctypes.c_long(nr), ctypes.c_void_p(addr), ctypes.c_int(1), ctypes.c_int(0x7fffffff),
                          None, None, ctypes.c_int(0))
    except OSError:
        pass


TIERS = {"best-effort": "DS_TIER_BEST_EFFORT", "burstable": "DS_TIER_BURSTABLE",
         "latency-critical": "DS_TIER_LATENCY_CRITICAL"}
ROLES = {"none": "DS_ROLE_NONE", "prefill": "DS_ROLE_PREFILL", "decode": "DS_ROLE_DECODE"}
MODES = {"none": "DS_MODE_NONE", "spatial": "DS_MODE_SPATIAL", "temporal": "DS_MODE_TEMPORAL",
         "unrestricted": "DS_MODE_UNRESTRICTED"}
_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,126}$")


class Tenant:
    def __init__(self, slot, gen, tenant_id, quota_file, client_page):
        self.slot, self.gen, self.id, self.quota_file, self.client_page = slot, gen, tenant_id, quota_file, client_page

    def env(self):
        """Environment for a process of this tenant (what `detshare run` sets)."""
        return {"DETSHARE_QUOTA_FILE": self.quota_file}


class Table:
    """A run directory with a table, a doorbell, client pages and quota files, written by this process."""

    def __init__(self, run_dir, layout, mm, fd):
        self.run_dir, self.L, self.mm, self._fd = run_dir, layout, mm, fd
        self.hdr = Region(mm, 0, layout.structs["ds_table_header"])
        self._pages = {}
        self._lock = threading.Lock()

    # --- files -----------------------------------------------------------------------------------------------
    @staticmethod
    def paths(run_dir):
        return {"table": os.path.join(run_dir, "table"), "doorbell": os.path.join(run_dir, "doorbell"),
                "clients": os.path.join(run_dir, "clients"), "tenants": os.path.join(run_dir, "tenants")}

    @classmethod
    def create(cls, run_dir, sm_count, group_sms=8, mem_total=80 << 30, gpu_name="GPU", gpu_uuid="GPU-unknown",
               mps_pipe_dir="", mode="spatial", layout=None, n_gpus=1, groups=None):
        """Creates a fresh table for n_gpus identical GPUs (index 0..n-1). The split is `groups` (SMs of each
        group, as the driver's cuDevSmResourceSplitByCount returns it: see gpuinfo.py) or, without it, an
        estimate of sm_count // group_sms groups. libdetshare refuses to confine kernels when the table's group
        count differs from the driver's, so pass the real split on a real GPU."""
        L = layout or Layout()
        if sm_count <= 0 or sm_count > 4096:
            raise ValueError("sm_count=%r: must be 1..4096" % (sm_count,))
        if group_sms <= 0 or group_sms > sm_count:
            raise ValueError("group_sms=%r: must be 1..sm_count (%d)" % (group_sms, sm_count))
        if mode not in MODES:
            raise ValueError("mode=%r: allowed %s" % (mode, ", ".join(MODES)))
        p = cls.paths(run_dir)
        os.makedirs(p["clients"], exist_ok=True)
        os.makedirs(p["tenants"], exist_ok=True)
        size = L["DS_TABLE_SIZE"]
        tmp = p["table"] + ".tmp.%d" % os.getpid()
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        os.ftruncate(fd, size)
        mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        t = cls(run_dir, L, mm, fd)
        h = t.hdr
        hs = L.structs
        h.set("magic", L["DS_TABLE_MAGIC"])
        h.set("abi_version", L["DS_TABLE_ABI_VERSION"])
        h.set("header_size", hs["ds_table_header"].size)
        h.set("table_size", size)
        h.set("max_gpus", L["DS_MAX_GPUS"])
        h.set("max_containers", L["DS_MAX_CONTAINERS"])
        h.set("gpu_entry_size", hs["ds_gpu"].size)
        h.set("container_entry_size", hs["ds_container"].size)
        h.set("gpus_offset", L["DS_GPUS_OFFSET"])
        h.set("containers_offset", L["DS_CONTAINERS_OFFSET"])
        h.set("created_ns", time.time_ns())
        h.set("n_gpus", n_gpus)
        if groups is None:
            groups = [group_sms] * min(sm_count // group_sms, L["DS_MAX_SM_GROUPS"])
        if not groups or len(groups) > L["DS_MAX_SM_GROUPS"] or sum(groups) > sm_count or min(groups) <= 0:
            raise ValueError("groups=%r: want 1..%d positive group sizes summing to at most sm_count (%d)"
                             % (groups, L["DS_MAX_SM_GROUPS"], sm_count))
        n_groups = len(groups)
        for i in range(n_gpus):
            g = t.gpu(i)
            g.set("state", L["DS_GPU_PRESENT"])
            g.set("index", i)
            g.set_str("uuid", gpu_uuid if n_gpus == 1 else "%s-%d" % (gpu_uuid, i))
            g.set_str("name", gpu_name[:63])
            g.set("mem_total", mem_total)
            g.set("sm_count", sm_count)
            g.set("split_min_size", group_sms)
            g.set("split_alignment", group_sms)
            g.set("n_groups", n_groups)
            g.set("remainder_sms", sm_count - sum(groups))
            for k, n in enumerate(groups):
                g.set("group_sms", n, k)
            g.set("split_state", L["DS_SPLIT_PUBLISHED"])
            g.set("mps_state", L["DS_MPS_RUNNING"] if mps_pipe_dir else L["DS_MPS_ABSENT"])
            g.set("mode", L[MODES[mode]])
            g.set_str("mps_pipe_dir", mps_pipe_dir)
        h.set("sched_pid", os.getpid())
        h.set("sched_start_time", _starttime(os.getpid()))
        h.set("sched_heartbeat_ns", time.monotonic_ns())
        h.set("sched_epoch", 1)
        h.set("state", L["DS_TABLE_READY"])
        mm.flush()
        os.rename(tmp, p["table"])
        # doorbell
        db = hs["ds_doorbell"]
        with open(p["doorbell"] + ".tmp", "wb") as f:
            f.write(struct.pack("<Q", L["DS_DOORBELL_MAGIC"]) + b"\0" * (db.size - 8))
        os.chmod(p["doorbell"] + ".tmp", 0o666)
        os.rename(p["doorbell"] + ".tmp", p["doorbell"])
        return t

    def close(self):
        for pg in self._pages.values():
            pg[0].close()
            os.close(pg[1])
        self._pages.clear()
        self.mm.close()
        os.close(self._fd)

    # --- regions ---------------------------------------------------------------------------------------------
    def gpu(self, i):
        return Region(self.mm, self.L["DS_GPUS_OFFSET"] + i * self.L.structs["ds_gpu"].size, self.L.structs["ds_gpu"])

    def container(self, slot):
        st = self.L.structs["ds_container"]
        return Region(self.mm, self.L["DS_CONTAINERS_OFFSET"] + slot * st.size, st)

    def page(self, slot):
        mm = self._pages[slot][0]
        return Region(mm, 0, self.L.structs["ds_client_page"])

    def n_groups(self, gpu=0):
        return self.gpu(gpu).get("n_groups")

    def group_mask_sms(self, groups, gpu=0):
        g = self.gpu(gpu)
        return sum(g.get("group_sms", k) for k in range(g.get("n_groups")) if groups >> k & 1)

    # --- registration (what cgroupgpu/tenant does) ------------------------------------------------------------
    def register(self, tenant_id, tier="best-effort", role="none", gpu=0, weight=1, guaranteed_groups=0,
                 mem_limit=0, lend=False, container_quota=False):
        if not _ID_RE.match(tenant_id or ""):
            raise ValueError("id=%r: must match %s" % (tenant_id, _ID_RE.pattern))
        if tier not in TIERS:
            raise ValueError("tier=%r: allowed %s" % (tier, ", ".join(TIERS)))
        if role not in ROLES:
            raise ValueError("role=%r: allowed %s" % (role, ", ".join(ROLES)))
        if weight < 1:
            raise ValueError("weight=%r: must be >= 1" % (weight,))
        if mem_limit < 0:
            raise ValueError("memory=%r: must be >= 0 bytes (0 = unlimited)" % (mem_limit,))
        if not 0 <= gpu < self.hdr.get("n_gpus"):
            raise ValueError("gpu=%r: allowed 0..%d" % (gpu, self.hdr.get("n_gpus") - 1))
        L = self.L
        with self._lock:
            slot = next((s for s in range(L["DS_MAX_CONTAINERS"])
                         if self.container(s).get("state") == L["DS_SLOT_FREE"]), None)
            if slot is None:
                raise RuntimeError("table full: %d containers registered" % L["DS_MAX_CONTAINERS"])
            c = self.container(slot)
            gen = c.get("gen") + 1
            c.set("state", L["DS_SLOT_RESERVED"])
            c.set("gen", gen)
            c.set_str("id", tenant_id)
            c.set("tier", L[TIERS[tier]])
            c.set("role", L[ROLES[role]])
            c.set("gpu", gpu)
            c.set("weight", weight)
            c.set("sm_groups_req", bin(guaranteed_groups).count("1") if isinstance(guaranteed_groups, int) else 0)
            c.set("sm_req", self.group_mask_sms(guaranteed_groups, gpu))
            c.set("mem_limit", mem_limit)
            c.set("registered_ns", time.time_ns())
            c.set("owner_pid", os.getpid())
            c.set("owner_start", _starttime(os.getpid()))
            c.set("flags", (L["DS_CF_LEND"] if lend else 0) | L["DS_CF_HOST_TENANT"])
            p = self.paths(self.run_dir)
            page_path = os.path.join(p["clients"], tenant_id + ".page")
            self._create_page(page_path, slot, gen, tenant_id)
            tdir = os.path.join(p["tenants"], tenant_id)
            os.makedirs(tdir, exist_ok=True)
            qf = os.path.join(tdir, "quota")
            g = self.gpu(gpu)
            # The keys cgroupgpu/quota.Render writes, in its order: what libdetshare reads (tier, SMs, memory limit,
            # weight and role are in the table slot above). TestPythonTableMatchesGoMirror compares the two.
            lines = ["# written by integration/gpu/dstable.py (a test fixture that sets grants on purpose)",
                     "version=1", "id=%s" % tenant_id, "slot=%d" % slot, "slot_gen=%d" % gen,
                     "gpu=%d" % gpu, "table=%s" % p["table"], "client_page=%s" % page_path,
                     "doorbell=%s" % p["doorbell"], "mps_pipe_dir=%s" % g.get_str("mps_pipe_dir")]
            with open(qf + ".tmp", "w") as f:
                f.write("\n".join(lines) + "\n")
            os.rename(qf + ".tmp", qf)
            c.set("state", L["DS_SLOT_ACTIVE"])
            self.hdr.add("generation")
        return Tenant(slot, gen, tenant_id, qf, page_path)

    def _create_page(self, path, slot, gen, tenant_id):
        L = self.L
        st = L.structs["ds_client_page"]
        tmp = path + ".tmp"
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o666)
        os.ftruncate(fd, st.size)
        mm = mmap.mmap(fd, st.size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        r = Region(mm, 0, st)
        r.set("abi_version", L["DS_TABLE_ABI_VERSION"])
        r.set("slot", slot)
        r.set("slot_gen", gen)
        r.set("max_procs", L["DS_MAX_PROCS"])
        r.set_str("id", tenant_id)
        r.set("magic", L["DS_CLIENT_MAGIC"])
        os.rename(tmp, path)
        self._pages[slot] = (mm, fd)

    def deregister(self, slot):
        c = self.container(slot)
        c.set("state", self.L["DS_SLOT_FREE"])
        self.hdr.add("generation")

    # --- scheduling (what the scheduler leader does) ----------------------------------------------------------
    def publish_grant(self, slot, groups, mode="spatial"):
        """Seqlock write of one grant, then the epoch bump and a futex wake (internal/table/grant.go's protocol).
        Python has no CAS on shared memory, so this writer assumes it is the only grant writer of its run
        directory (true for the private run directories of these scripts; never point it at a live scheduler's)."""
        if mode not in MODES:
            raise ValueError("mode=%r: allowed %s" % (mode, ", ".join(MODES)))
        c = self.container(slot)
        n = self.n_groups(c.get("gpu"))
        if groups < 0 or groups >> n:
            raise ValueError("groups=%#x: the GPU's split has %d groups (mask < %#x)" % (groups, n, 1 << n))
        with self._lock:
            seq = c.get("grant_seq")
            if seq & 1:
                seq += 1  # a previous writer died mid-write; make it even before starting
            c.set("grant_seq", seq + 1)
            c.set("grant_groups", groups)
            c.set("grant_sms", self.group_mask_sms(groups, c.get("gpu")))
            c.set("grant_mode", self.L[MODES[mode]])
            c.set("grant_ns", time.monotonic_ns())
            c.set("demand_seen_ns", time.monotonic_ns())
            c.set("grant_seq", seq + 2)
            c.add("grant_epoch")
            self.gpu(c.get("gpu")).add("grant_changes")
        futex_wake(c.ptr("grant_epoch"))

    def heartbeat(self):
        self.hdr.set("sched_heartbeat_ns", time.monotonic_ns())


def _starttime(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return 0


def full_mask(n):
    return (1 << n) - 1


def range_mask(first, count):
    return ((1 << count) - 1) << first


class GrantChanger(threading.Thread):
    """Publishes a new grant for one tenant every period_s, cycling through masks (the determinism test's
    'grant changes every few ms'). Also refreshes the scheduler heartbeat so clients never see a dead leader."""

    def __init__(self, table, slot, masks, period_s=0.005):
        super().__init__(daemon=True)
        self.table, self.slot, self.masks, self.period = table, slot, masks, period_s
        self.changes = 0
        self._stop_ev = threading.Event()

    def run(self):
        i = 0
        while not self._stop_ev.wait(self.period):
            self.table.publish_grant(self.slot, self.masks[i % len(self.masks)])
            self.table.heartbeat()
            self.changes += 1
            i += 1

    def stop(self):
        self._stop_ev.set()
        self.join()


class Heartbeat(threading.Thread):
    """Keeps sched_heartbeat_ns fresh so that clients treat the fixture's table as having a live leader."""

    def __init__(self, table, period_s=0.1):
        super().__init__(daemon=True)
        self.table, self.period, self._stop_ev = table, period_s, threading.Event()

    def run(self):
        while not self._stop_ev.wait(self.period):
            self.table.heartbeat()

    def stop(self):
        self._stop_ev.set()
        self.join()


def _parse_mask(s, n):
    """'0-3', '4-14', 'all', '0,2,5' or '0x0f' -> group bitmask."""
    s = s.strip()
    if s == "all":
        return full_mask(n)
    if s in ("", "none"):
        return 0
    if s.lower().startswith("0x"):
        return int(s, 16)
    m = 0
    for part in s.split(","):
        if "-" in part:
            a, b = part.split("-", 1)
            for k in range(int(a), int(b) + 1):
                m |= 1 << k
        else:
            m |= 1 << int(part)
    return m


def main(argv=None):
    ap = argparse.ArgumentParser(
        description="Write a DetShare table/quota files from Python: a test fixture that sets grants on purpose "
                    "(not a scheduler; bench.py runs the real one). Layout parsed from "
                    "internal/table/detshare_table.h.")
    ap.add_argument("--header", default=DEFAULT_HEADER, help="path of detshare_table.h")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("layout", help="print the parsed layout (sizes and offsets) as JSON")
    c = sub.add_parser("create", help="create a run directory with tenants and static grants, then hold it "
                                      "(heartbeat) until killed or --hold-s elapses; prints quota file paths")
    c.add_argument("--run-dir", required=True)
    c.add_argument("--sms", type=int, required=True, help="SM count of the GPU")
    c.add_argument("--group-sms", type=int, default=8, help="SMs per group of the split (H100: 8)")
    c.add_argument("--groups", default="", help="comma-separated SMs of each group as the driver splits them "
                                                 "(gpuinfo.py prints it); default sms // group-sms groups")
    c.add_argument("--mem-total", type=int, default=80 << 30)
    c.add_argument("--mps-pipe-dir", default="")
    c.add_argument("--tenant", action="append", default=[],
                   help="ID:TIER:GROUPS[:MEMBYTES[:ROLE]], e.g. lc:latency-critical:0-3 or be:best-effort:4-14")
    c.add_argument("--hold-s", type=float, default=0, help="keep heartbeating this long (0: exit at once)")
    a = ap.parse_args(argv)
    L = Layout(a.header)
    if a.cmd == "layout":
        import json
        out = {name: {"size": st.size, "fields": {f.name: f.offset for f in st.fields.values()}}
               for name, st in L.structs.items()}
        out["defines"] = {k: v for k, v in L.defines.items() if not k.startswith("sizeof:")}
        print(json.dumps(out, indent=1, sort_keys=True))
        return 0
    try:
        groups = [int(x) for x in a.groups.split(",")] if a.groups else None
    except ValueError:
        ap.error("--groups=%r: want comma-separated SM counts, e.g. 8,8,8" % a.groups)
    n = len(groups) if groups else a.sms // a.group_sms
    # validate every tenant before anything is written, so bad input leaves nothing behind
    specs = []
    for spec in a.tenant:
        parts = spec.split(":")
        if len(parts) < 3:
            ap.error("--tenant %r: want ID:TIER:GROUPS[:MEMBYTES[:ROLE]]" % spec)
        tid, tier = parts[0], parts[1]
        if not _ID_RE.match(tid):
            ap.error("--tenant %r: id=%r must match %s" % (spec, tid, _ID_RE.pattern))
        if tier not in TIERS:
            ap.error("--tenant %r: tier=%r, allowed %s" % (spec, tier, ", ".join(TIERS)))
        try:
            mask = _parse_mask(parts[2], n)
        except ValueError:
            ap.error("--tenant %r: groups=%r, want e.g. 0-3, 4,5 or all" % (spec, parts[2]))
        if mask >> n:
            ap.error("--tenant %r: groups=%r, the split has groups 0..%d" % (spec, parts[2], n - 1))
        try:
            mem = int(parts[3]) if len(parts) > 3 and parts[3] else 0
        except ValueError:
            ap.error("--tenant %r: memory=%r, want bytes" % (spec, parts[3]))
        role = parts[4] if len(parts) > 4 else "none"
        if role not in ROLES:
            ap.error("--tenant %r: role=%r, allowed %s" % (spec, role, ", ".join(ROLES)))
        specs.append((tid, tier, mask, mem, role))
    t = Table.create(a.run_dir, a.sms, a.group_sms, a.mem_total, mps_pipe_dir=a.mps_pipe_dir, layout=L, groups=groups)
    for tid, tier, mask, mem, role in specs:
        guaranteed = mask if tier != "best-effort" else 0
        q = t.register(tid, tier=tier, role=role, guaranteed_groups=guaranteed, mem_limit=mem)
        t.publish_grant(q.slot, mask)
        print("%s slot=%d quota=%s" % (tid, q.slot, q.quota_file))
    sys.stdout.flush()
    end = time.monotonic() + a.hold_s
    while time.monotonic() < end:
        t.heartbeat()
        time.sleep(0.1)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (LayoutError, ValueError) as e:
        print("dstable: %s" % e, file=sys.stderr)
        sys.exit(2)
