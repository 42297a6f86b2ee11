#!/usr/bin/env python3
"""Checks that no #include runs from a lower floor to a higher one (docs/architecture.md).

Floors, lowest first: proto -> common -> kernels -> core -> worker | server -> clients -> cli.
A folder may include its own files and anything on a lower floor; worker/ and server/ never
include each other; inside core/ each folder names the core folders it may use. Inside kernels/
the floors go on: its interfaces and shared helpers (codec.h, registry.h, select.h, ...) ->
format/ (the wire formats CPU and CUDA share) -> cpu/ | cuda/ (the codecs, side by side) -> the
files that assemble codecs (KERNELS_ASSEMBLY: builtin.cc, dgc_memory.cc). Test files (*_test.cc)
may also use tests/testing/, and inside a floor's folder anything of that folder. tests/ itself
may include anything.

Usage: check_floors.py [SOURCE_ROOT]; exits 1 and lists every upward include it finds.
"""
import os
import re
import sys

FLOOR = {"proto": 0, "common": 1, "kernels": 2, "core": 3, "worker": 4, "server": 4,
         "clients": 5, "bench": 6, "cli": 6, "examples": 6}
# Inside the shared floor: which core folders each may include besides itself.
CORE_USES = {"rpc": set(), "model": set(), "topology": set(), "federated": {"model"},
             "workload": {"model"}}
# Inside kernels/: each sub-folder's floor; files directly in kernels/ are at 0 unless they
# assemble codecs.
KERNELS_FLOOR = {"": 0, "format": 1, "cpu": 2, "cuda": 2}
KERNELS_ASSEMBLY = {"builtin", "dgc_memory"}
SOURCES = (".h", ".cc", ".cu", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def room(path):
    """(floor name, core folder or None) of a path relative to the root, or None if outside."""
    parts = path.split("/")
    if parts[0] == "tern":  # generated from proto/tern/v1
        return ("proto", None)
    if parts[0] not in FLOOR:
        return None
    if parts[0] == "core":
        return ("core", parts[1] if len(parts) > 2 else None)
    return (parts[0], None)


def kernels_room(path):
    """(sub-folder, floor) of a path inside kernels/."""
    parts = path.split("/")
    if len(parts) == 2:
        stem = os.path.splitext(parts[1])[0]
        return ("", 3 if stem in KERNELS_ASSEMBLY else 0)
    return (parts[1], KERNELS_FLOOR.get(parts[1], 0))


def kernels_violation(src, inc):
    if src.endswith("_test.cc"):
        return None
    (hs, hf), (ts, tf) = kernels_room(src), kernels_room(inc)
    if tf < hf or (hs == ts and tf == hf):
        return None
    if tf == hf:
        return f"kernels/{hs}/ and kernels/{ts}/ are side by side and never include each other"
    return f"inside kernels/, {src} (floor {hf}) is below {inc} (floor {tf})"


def violation(src, inc):
    here, there = room(src), room(inc)
    if inc.startswith("tests/testing/") and src.endswith("_test.cc"):
        return None
    if here is None or there is None:
        return None
    (hf, hc), (tf, tc) = here, there
    if hf == tf:
        if hf == "core" and hc != tc and tc not in CORE_USES.get(hc, set()):
            return f"core/{hc} may not include core/{tc} (add it to CORE_USES if it belongs)"
        if hf == "kernels":
            return kernels_violation(src, inc)
        return None
    if FLOOR[tf] < FLOOR[hf]:
        return None
    if FLOOR[tf] == FLOOR[hf]:
        return f"{hf}/ and {tf}/ are side by side and never include each other"
    return f"{hf}/ is below {tf}/"


def self_check():
    """The rules catch what they are for (a rule that stopped matching would pass any tree)."""
    upward = [("kernels/select.cc", "kernels/cpu/simd_rng.h"),
              ("kernels/codec.cc", "kernels/format/payload.h"),
              ("kernels/cpu/topk.cc", "kernels/cuda/topk.h"),
              ("kernels/cpu/dgc.cc", "kernels/builtin.h"),
              ("worker/engine.cc", "server/aggregator.h"),
              ("core/rpc/channel.cc", "core/model/bundle.h"),
              ("common/rng.h", "kernels/codec.h")]
    fine = [("kernels/cpu/topk.cc", "kernels/format/sparse.h"),
            ("kernels/builtin.cc", "kernels/cpu/topk.h"),
            ("kernels/select_test.cc", "kernels/cpu/topk.h"),
            ("kernels/format/sparse.h", "kernels/codec.h"),
            ("core/federated/x.cc", "core/model/bundle.h")]
    for src, inc in upward:
        assert violation(src, inc), f"{src} -> {inc} should be refused"
    for src, inc in fine:
        assert not violation(src, inc), f"{src} -> {inc} should be allowed"


def main():
    self_check()
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                           os.path.join(os.path.dirname(__file__), ".."))
    bad = []
    checked = 0
    for top in FLOOR:
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for name in files:
                if not name.endswith(SOURCES):
                    continue
                full = os.path.join(dirpath, name)
                src = os.path.relpath(full, root)
                with open(full, encoding="utf-8", errors="replace") as f:
                    text = f.read()
                checked += 1
                for inc in INCLUDE.findall(text):
                    why = violation(src, inc)
                    if why:
                        bad.append(f"{src}: #include \"{inc}\": {why}")
    for line in bad:
        print(line)
    print(f"{checked} files checked, {len(bad)} upward includes")
    return 1 if bad or checked == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
