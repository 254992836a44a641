"""Fuzz benchmark (issue 19): damaged codec frames and bundles get the project's own error, in
bounded time and memory.

Two parts, each input timed and its peak memory measured on its own:

* **frames** (default 100,000): :func:`nestflex.deploy.codec.decode` with ``--max-elements`` on
  random bytes (some behind a valid magic), truncated frames, bit flips (with the CRC kept or
  forged), random header bytes and header-field edits (forged CRC), spliced frames, and
  compression bombs for every codec (``--bomb-mb``, 256 MB, of zeros compressed into a frame that declares
  0 bytes, a few bytes, the limit or a random size; the Blosc header patched to agree). Only
  ``CodecError`` may come out.
* **bundles** (default 10,000): the corruption corpus of ``nestflex.testing.corruption`` (every
  kind in turn, consecutive seeds) on a tiny real bundle with ONNX files; each case is loaded
  with :func:`nestflex.deploy.load` (timed, memory measured), and a bundle that loads is run at
  every level and exit set (not timed) and must give the good bundle's outputs bit for bit,
  unless the damage rewrote the checksums (then it must run). Only ``BundleError`` may come out.

Peak memory per input: on Linux, writing ``5`` to ``/proc/self/clear_refs`` resets the process's
peak RSS (``VmHWM``) to its current RSS; the figure is ``VmHWM`` after the input minus ``VmRSS``
before it. Elsewhere the growth of ``ru_maxrss`` (a lower bound) is reported and
``memory_method`` says so.

Writes ``--out/summary.json``:

* ``config``: sizes, seed, ``max_elements`` and the frame limit in bytes (``limit_bytes``:
  ``max_elements`` x 8, the largest payload a frame may declare), the bundle's files;
* ``frames`` / ``bundles``: ``inputs``, ``outcomes`` (count per result: ``ok``/``CodecError``,
  ``refused``/``identical``/``runs``, or an exception type name), ``worst_ms``, ``median_ms``,
  ``worst_peak_mb``, and per mutation or corruption kind the same (``by_mutation``,
  ``by_kind``); bundles add ``worst_beyond_own_mb`` (peak minus the bytes the case's files
  occupy on disk); ``bugs``: the first inputs of every other outcome (kind, seed, exception);
* ``goals``: one entry per goal of issue 19 (``target``, ``measured``, ``met``, ``note``);
* ``machine``, ``loadavg`` (start, end: the machine is shared), ``memory_method``, ``seconds``.

Example:
    python benchmarks/deploy/fuzz.py --run-name default             # the defaults, ~15 min -> docs/results/fuzz/default/
    python benchmarks/deploy/fuzz.py --out /tmp/fuzz --frames 2000 --bundles 200   # a smoke run
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import shutil
import statistics
import struct
import sys
import tempfile
import time
import zlib
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, Callable

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: the repository root, for benchmarks.*
from benchmarks._common import add_out_args, resolve_out, write_run  # noqa: E402

from nestflex.testing import corruption as _corruption  # noqa: E402

from nestflex._io import write_json  # noqa: E402
from nestflex._machine import machine  # noqa: E402
from nestflex.deploy import BundleError, load  # noqa: E402
from nestflex.deploy.codec import CodecError, decode, encode, get_codec  # noqa: E402
from nestflex.deploy.codec.frame import MAGIC, VERSION  # noqa: E402

TIME_LIMIT_S = 1.0
BEYOND_OWN_LIMIT_MB = 64.0
FRAME_PEAK_FACTOR = 4  # decode may hold the compressed payload, the decompressed bytes, the codes, the tensor
BUG_EXAMPLES = 5


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_out_args(p, "summary.json and run.json")
    p.add_argument("--frames", type=int, default=100_000, help="fuzzed frames")
    p.add_argument("--bundles", type=int, default=10_000, help="corrupted bundles")
    p.add_argument("--max-elements", type=int, default=2**20, help="decode's max_elements (the frame limit)")
    p.add_argument("--bomb-mb", type=int, default=256, help="MB of zeros compressed into each codec's bomb "
                                                            "(default: 32x the default limit)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--work", type=Path, default=None, help="where cases are written (default: a temp dir)")
    args = p.parse_args(argv)
    for name, least in (("frames", 0), ("bundles", 0), ("max_elements", 1), ("bomb_mb", 1)):
        if getattr(args, name) < least:
            p.error(f"--{name.replace('_', '-')} must be >= {least}, got {getattr(args, name)}")
    resolve_out(args, __file__)
    return args


# --------------------------------------------------------------------------------------------
# measuring one input


class Meter:
    """Time and peak memory of one call: ``VmHWM`` after, minus ``VmRSS`` before, with the peak
    reset in between (``/proc/self/clear_refs``); else the growth of ``ru_maxrss``.

    With glibc, buffers of 128 KiB and more are always mmap-ed (``mallopt``) and free heap memory is
    returned before each input (``malloc_trim``): otherwise glibc's adaptive threshold keeps a freed
    16 MB buffer resident, and the next input's 16 MB fit in it without raising the peak (measured:
    32 MB, then 0 MB for the same parse)."""

    def __init__(self) -> None:
        self._trim = None
        try:
            import ctypes

            libc = ctypes.CDLL("libc.so.6")
            if libc.mallopt(-3, 128 << 10) == 1:  # M_MMAP_THRESHOLD: fixed, no longer adaptive
                self._trim = libc.malloc_trim
        except (OSError, AttributeError):  # not glibc: the figures may then be lower bounds
            pass
        try:
            self._reset()
            self._status()
            self.method = "VmHWM after the input minus VmRSS before, peak reset via /proc/self/clear_refs"
        except OSError:
            self.method = "growth of ru_maxrss (a lower bound: /proc/self/clear_refs is not available)"
        if self._trim is not None:
            self.method += "; glibc mmap threshold fixed at 128 KiB and malloc_trim(0) before each input"

    @staticmethod
    def _reset() -> None:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")

    @staticmethod
    def _status() -> dict[str, int]:
        out = {}
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(("VmHWM:", "VmRSS:")):
                    key, value = line.split(":")
                    out[key] = int(value.split()[0]) * 1024
        return out

    def measure(self, fn: Callable[[], Any]) -> tuple[Any, BaseException | None, float, int]:
        """``(result, exception, seconds, peak_bytes)`` of ``fn()``."""
        proc = self.method.startswith("VmHWM")
        if self._trim is not None:
            self._trim(0)
        if proc:
            before = self._status()["VmRSS"]
            self._reset()
        else:
            before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        result, error = None, None
        start = time.perf_counter()
        try:
            result = fn()
        except Exception as e:  # classified by the caller: the point is to see every type
            error = e
        seconds = time.perf_counter() - start
        after = self._status()["VmHWM"] if proc else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        return result, error, seconds, max(0, after - before)


class Tally:
    """Outcomes, worst and median time, worst peak memory, overall and per group."""

    def __init__(self) -> None:
        self.outcomes: Counter[str] = Counter()
        self.groups: dict[str, dict[str, Any]] = defaultdict(lambda: {"outcomes": Counter(), "ms": [], "peak": 0,
                                                                       "beyond": None})
        self.bugs: dict[str, list[dict[str, Any]]] = defaultdict(list)

    def add(self, group: str, outcome: str, seconds: float, peak: int, beyond: int | None = None,
            bug: dict[str, Any] | None = None) -> None:
        g = self.groups[group]
        self.outcomes[outcome] += 1
        g["outcomes"][outcome] += 1
        g["ms"].append(1e3 * seconds)
        g["peak"] = max(g["peak"], peak)
        if beyond is not None:
            g["beyond"] = beyond if g["beyond"] is None else max(g["beyond"], beyond)
        if bug is not None and len(self.bugs[outcome]) < BUG_EXAMPLES:
            self.bugs[outcome].append(bug)

    def summary(self, by: str) -> dict[str, Any]:
        ms = [t for g in self.groups.values() for t in g["ms"]]
        rows = {}
        for name, g in sorted(self.groups.items()):
            rows[name] = {"inputs": len(g["ms"]), "outcomes": dict(g["outcomes"]), "worst_ms": round(max(g["ms"]), 3),
                          "median_ms": round(statistics.median(g["ms"]), 4), "worst_peak_mb": round(g["peak"] / 1e6, 3)}
            if g["beyond"] is not None:
                rows[name]["worst_beyond_own_mb"] = round(g["beyond"] / 1e6, 3)
        out = {"inputs": len(ms), "outcomes": dict(self.outcomes), "worst_ms": round(max(ms), 3) if ms else None,
               "median_ms": round(statistics.median(ms), 4) if ms else None,
               "worst_peak_mb": max((r["worst_peak_mb"] for r in rows.values()), default=None), by: rows,
               "bugs": dict(self.bugs)}
        beyond = [r["worst_beyond_own_mb"] for r in rows.values() if "worst_beyond_own_mb" in r]
        if beyond:
            out["worst_beyond_own_mb"] = max(beyond)
        return out


# --------------------------------------------------------------------------------------------
# frames


def _resign(body: bytes) -> bytes:
    """``body`` (a frame without its trailer, or a whole damaged frame's first bytes) with a valid CRC."""
    return body + struct.pack("<I", zlib.crc32(body))


def _seed_frames(rng: torch.Generator) -> list[bytes]:
    xs = [torch.relu(torch.randn(2, 3, 5, 5, generator=rng)), torch.relu(torch.randn(3, 4, generator=rng))]
    frames = [encode(xs, b, c) for c in ("blosc_lz4", "lz4", "raw", "zlib") for b in (None, 1, 3, 4, 8, 12, 16)]
    frames.append(encode([torch.tensor(1.5), torch.zeros(0, 2)], 5, "zlib", per_sample=False))
    frames.append(encode([torch.randn(2, 3, generator=rng).to(torch.float64)], None, "lz4"))
    return frames


def _bomb_payloads(nbytes: int) -> dict[str, bytes]:
    """Each codec's payload of ``nbytes`` zeros (raw: the zeros themselves, cut to 1 MB: a payload
    longer than it declares)."""
    zeros = bytes(nbytes)
    out = {name: get_codec(name).compress(zeros) for name in ("blosc_lz4", "lz4", "zlib")}
    out["raw"] = zeros[: 1 << 20]  # raw cannot expand: a payload longer than it declares
    return out


def _bomb_frame(codec: str, payload: bytes, numel: int, float64: bool) -> bytes:
    """One float tensor of ``numel`` elements whose payload is ``payload`` (forged CRC)."""
    c = get_codec(codec)
    raw_len = numel * (8 if float64 else 4)
    if codec == "blosc_lz4" and len(payload) >= 16:  # make Blosc's own header agree with the frame's claim
        payload = payload[:4] + struct.pack("<III", raw_len, struct.unpack_from("<I", payload, 8)[0], len(payload)) \
            + payload[16:]
    body = (struct.pack("<4sHHI", MAGIC, VERSION, 0, 1) + struct.pack("<BBBBBI", 3 if float64 else 0, 0, c.id, 1, 0, 0)
            + struct.pack("<I", numel) + struct.pack("<QQ", raw_len, len(payload)) + payload)
    return _resign(body)


# field offsets of a frame's first tensor: count, then dtype, bits, codec, rank, flags, n_side, shape[0]
_FIELDS = {"count": (8, "<I"), "dtype": (12, "<B"), "bits": (13, "<B"), "codec": (14, "<B"), "rank": (15, "<B"),
           "flags": (16, "<B"), "n_side": (17, "<I"), "shape0": (21, "<I"), "version": (4, "<H"), "frame_flags": (6, "<H")}
_EXTREMES = [0, 1, 2, 7, 8, 9, 16, 17, 255, 256, 2**16 - 1, 2**31, 2**32 - 1]


def _mutations(seeds: list[bytes], bombs: dict[str, bytes], max_elements: int) -> dict[str, Callable[[random.Random], bytes]]:
    def pick(r: random.Random) -> bytearray:
        return bytearray(r.choice(seeds))

    def random_bytes(r):
        data = r.randbytes(r.randrange(0, 512))
        return (MAGIC + struct.pack("<H", VERSION) + data) if r.random() < 0.5 else data

    def truncate(r):
        f = pick(r)
        cut = f[: r.randrange(0, len(f))]
        return _resign(bytes(cut[:-4])) if r.random() < 0.5 and len(cut) > 16 else bytes(cut)

    def flip(forged: bool):
        def go(r):
            f = pick(r)
            for _ in range(r.randint(1, 8)):
                f[r.randrange(len(f))] ^= 1 << r.randrange(8)
            return _resign(bytes(f[:-4])) if forged else bytes(f)
        return go

    def header_bytes(r):
        f = pick(r)
        for _ in range(r.randint(1, 4)):
            f[r.randrange(min(len(f) - 4, 64))] = r.randrange(256)
        return _resign(bytes(f[:-4]))

    def field_edit(r):
        f = pick(r)
        name = r.choice(sorted(_FIELDS))
        offset, fmt = _FIELDS[name]
        size = struct.calcsize(fmt)
        value = r.choice([v for v in _EXTREMES if v < 256 ** size] + [r.randrange(256 ** size)])
        if offset + size <= len(f) - 4:
            struct.pack_into(fmt, f, offset, value)
        return _resign(bytes(f[:-4]))

    def lengths_edit(r):  # raw_len / comp_len of the first tensor of a one-tensor frame
        f = bytearray(r.choice([s for s in seeds if struct.unpack_from("<I", s, 8)[0] == 1] or seeds))
        rank, n_side = f[15], struct.unpack_from("<I", f, 17)[0]
        at = 21 + 4 * rank + 8 * n_side + 8 * r.randrange(2)
        if at + 8 <= len(f) - 4:
            struct.pack_into("<Q", f, at, r.choice([0, 1, 2**32, 2**63, 2**64 - 1, r.randrange(2**20)]))
        return _resign(bytes(f[:-4]))

    def splice(r):
        f = pick(r)
        a, b = sorted(r.randrange(len(f)) for _ in range(2))
        g = f[:a] + f[b:] if r.random() < 0.5 else f[:b] + f[a:]
        return _resign(bytes(g[:-4])) if r.random() < 0.5 and len(g) > 16 else bytes(g)

    def bomb(codec: str):
        def go(r):
            numel = r.choice([0, 1, 4, 1024, max_elements, r.randrange(max_elements + 1), max_elements + 1])
            return _bomb_frame(codec, bombs[codec], numel, float64=r.random() < 0.5)
        return go

    out = {"random_bytes": random_bytes, "truncate": truncate, "flip": flip(False), "flip_forged_crc": flip(True),
           "header_bytes": header_bytes, "field_edit": field_edit, "lengths_edit": lengths_edit, "splice": splice}
    out.update({f"bomb_{c}": bomb(c) for c in sorted(bombs)})
    return out


def fuzz_frames(n: int, max_elements: int, bomb_bytes: int, seed: int, meter: Meter) -> dict[str, Any]:
    seeds = _seed_frames(torch.Generator().manual_seed(seed))
    bombs = _bomb_payloads(bomb_bytes)
    mutations = _mutations(seeds, bombs, max_elements)
    names = sorted(mutations)
    tally = Tally()
    for i in range(n):
        name = names[i % len(names)]
        r = random.Random(f"frame:{seed}:{i}")
        frame = mutations[name](r)
        out, error, seconds, peak = meter.measure(lambda: decode(frame, max_elements=max_elements))
        if error is None:
            outcome = "ok"
        else:
            outcome = "CodecError" if isinstance(error, CodecError) else type(error).__name__
        bug = None if outcome in ("ok", "CodecError") else {"mutation": name, "index": i, "error": repr(error)[:300]}
        tally.add(name, outcome, seconds, max(0, peak - len(frame)), bug=bug)
        del out
        if (i + 1) % max(1, n // 10) == 0:
            print(f"frames {i + 1}/{n}: {dict(tally.outcomes)}", flush=True)
    result = tally.summary("by_mutation")
    result["bomb_zeros_bytes"] = bomb_bytes
    result["note"] = ("peak memory per frame minus the frame's own bytes; bombs carry "
                      f"{bomb_bytes >> 20} MB of zeros compressed")
    return result


# --------------------------------------------------------------------------------------------
# bundles


def _own_bytes(root: Path) -> int:
    """Bytes the case's files occupy on disk (sparse files count what is allocated, links nothing)."""
    total = 0
    for p in root.rglob("*"):
        try:
            st = p.lstat()
        except OSError:
            continue
        if p.is_file() and not p.is_symlink():
            total += min(st.st_size, st.st_blocks * 512)
    return total


def fuzz_bundles(n: int, seed: int, work: Path, meter: Meter) -> tuple[dict[str, Any], dict[str, Any]]:
    good = _corruption.tiny_bundle(work / "good.nfx")
    reference = _corruption.run_outputs(load(good))
    files = {p.relative_to(good).as_posix(): p.stat().st_size for p in sorted(good.rglob("*")) if p.is_file()}
    kinds = sorted(_corruption.KINDS)
    tally = Tally()
    for i in range(n):
        kind, case_seed = kinds[i % len(kinds)], seed * 1_000_000 + i // len(kinds)
        case_dir = work / f"case-{i}"
        case = _corruption.corrupt(good, case_dir / "b.nfx", kind, case_seed)
        own = _own_bytes(case_dir)
        bundle, error, seconds, peak = meter.measure(lambda: load(case.path))
        if isinstance(error, BundleError):
            outcome = "refused"
        elif error is not None:
            outcome = type(error).__name__
        else:
            try:  # a bundle that loads must run: with the good one's outputs, unless the checksums were rewritten
                outcome = _corruption.outcome(case, reference)
            except AssertionError:
                outcome = "silent_change"
            except Exception as e:  # the runtime failing on a bundle load accepted
                error, outcome = e, f"runtime_{type(e).__name__}"
        bug = None if outcome in ("refused", "identical", "runs") else {
            "kind": kind, "seed": case_seed, "case": case.description, "error": repr(error)[:300]}
        tally.add(kind, outcome, seconds, peak, beyond=peak - own, bug=bug)
        del bundle
        shutil.rmtree(case_dir, ignore_errors=True)
        if (i + 1) % max(1, n // 20) == 0:
            print(f"bundles {i + 1}/{n}: {dict(tally.outcomes)}", flush=True)
    result = tally.summary("by_kind")
    result["note"] = ("load() timed and measured; a bundle that loads is then run (not timed) and compared with "
                      "the good bundle; peak memory is also given beyond the bytes the case's files occupy")
    return result, {"files": files, "bytes": sum(files.values())}


# --------------------------------------------------------------------------------------------
# goals and main


def goals(frames: dict[str, Any], bundles: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    limit_mb = args.max_elements * 8 / 1e6
    other_bundle = {k: v for k, v in bundles["outcomes"].items() if k not in ("refused", "identical", "runs")}
    other_frame = {k: v for k, v in frames["outcomes"].items() if k not in ("ok", "CodecError")}
    frame_peak = frames["worst_peak_mb"]
    return {
        "bundle_exception_types": {
            "target": "0 outcomes other than BundleError, identical outputs, or (checksums rewritten) runs",
            "measured": other_bundle, "met": not other_bundle and bundles["inputs"] >= 10_000,
            "note": f"{bundles['inputs']} corrupted bundles, {len(bundles['by_kind'])} kinds (target >= 10,000)"},
        "bundle_time": {
            "target": f"<= {TIME_LIMIT_S} s per bundle to load or refuse", "measured": bundles["worst_ms"] / 1e3,
            "met": bundles["worst_ms"] / 1e3 <= TIME_LIMIT_S,
            "note": f"worst of {bundles['inputs']}; median {bundles['median_ms']} ms; on a shared 2-core machine"},
        "bundle_memory": {
            "target": f"<= {BEYOND_OWN_LIMIT_MB:g} MB peak beyond the bundle's own size",
            "measured": bundles["worst_beyond_own_mb"],
            "met": bundles["worst_beyond_own_mb"] <= BEYOND_OWN_LIMIT_MB,
            "note": f"worst peak without subtracting the bundle: {bundles['worst_peak_mb']} MB"},
        "frame_exception_types": {
            "target": "0 exception types other than CodecError", "measured": other_frame,
            "met": not other_frame and frames["inputs"] >= 100_000,
            "note": f"{frames['inputs']} fuzzed frames (target >= 100,000)"},
        "frame_memory": {
            "target": f"peak per frame <= {FRAME_PEAK_FACTOR} x the configured limit ({limit_mb:g} MB: "
                      f"max_elements={args.max_elements} x 8 bytes), beyond the frame itself",
            "measured": frame_peak, "met": frame_peak <= FRAME_PEAK_FACTOR * limit_mb,
            "note": f"bombs of {args.bomb_mb} MB of zeros ({args.bomb_mb * 2**20 / (args.max_elements * 8):g}x the limit) for "
                    f"every codec; worst frame time {frames['worst_ms']} ms"},
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.time()
    torch.set_num_threads(1)
    meter = Meter()
    load_start = os.getloadavg()
    print(f"fuzz: {args.frames} frames, {args.bundles} bundles; memory: {meter.method}", flush=True)
    frames = fuzz_frames(args.frames, args.max_elements, args.bomb_mb << 20, args.seed, meter)
    work = Path(tempfile.mkdtemp(prefix="nestflex-fuzz-", dir=args.work))
    try:
        bundles, bundle_info = fuzz_bundles(args.bundles, args.seed, work, meter)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    summary = {
        "benchmark": "fuzz", "schema_version": 1,
        "config": {"frames": args.frames, "bundles": args.bundles, "seed": args.seed,
                   "max_elements": args.max_elements, "limit_bytes": args.max_elements * 8, "bomb_mb": args.bomb_mb,
                   "bundle": bundle_info, "kinds": sorted(_corruption.KINDS)},
        "frames": frames, "bundles": bundles, "goals": goals(frames, bundles, args),
        "memory_method": meter.method, "machine": machine(torch_threads=torch.get_num_threads()),
        "loadavg": {"start": [round(v, 2) for v in load_start], "end": [round(v, 2) for v in os.getloadavg()]},
        "seconds": round(time.time() - started, 1),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "summary.json", summary)
    write_run(args.out, __file__, argv)
    for name, g in summary["goals"].items():
        print(f"goal {name}: met={g['met']} measured={g['measured']}")
    print(f"wrote {args.out / 'summary.json'} in {summary['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
