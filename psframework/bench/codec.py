"""psf bench codec: accuracy and speed of SAZD coding next to polynomial codes and a plain NumPy sum.

Accuracy: worst relative max error of float32 decoding over all k-subsets of packets (a seeded
sample where there are more than --limit), for SAZD and real polynomial codes. Speed: encoding,
schedule compilation and cached decoding of an 8 MiB float32 block set, next to the memory-bound
reference of summing the same k packets with NumPy, measured in the same run (medians of repeats).
SAZD decodes with --threads decode threads and Poly with as many BLAS threads, so the comparison
is like for like; a thread table shows what the decode threads gain on 1, 2 and 4 times the block
set. Mixed precision (psframework.bench.precision): a coded convolution whose workers compute in bf16
or fp16 and whose server decodes in fp32, over every k-subset of packets, for SAZD and Poly. Writes
codec.json and the codec.md rendered from it (atomically) to --out.
"""

from __future__ import annotations

import argparse
import itertools
import os
import platform
import random
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from psframework import environment
from psframework.bench import expectations as expect
from psframework.bench import report as rep
from psframework.bench.machine import cpu_model
from psframework.codes import PolyCode, SAZDCode, get_decode_threads, measure_decode_error
from psframework.codes.threads import check_threads
from psframework.codes.zigzag import MIN_STRIPE_SYMBOL_BYTES, plan_stripes

PAIRS = [(4, 3), (6, 4), (8, 6), (12, 8), (16, 12), (20, 16)]
SYMBOLS = [8, 16, 32, 64]
SPEED_SYMBOLS = 16  # the block length of the speed tables
SYMBOL_WIDTH = 64  # values per symbol in the accuracy table
CODES: List[Tuple[str, Callable[[int, int], Any]]] = [
    ("SAZD", lambda n, k: SAZDCode(n, k)),
    ("Poly chebyshev", lambda n, k: PolyCode(n, k, "chebyshev")),
    ("Poly equispaced", lambda n, k: PolyCode(n, k, "equispaced")),
    ("Poly integers", lambda n, k: PolyCode(n, k, "integers")),
]
DROP_PATTERNS_TIMED = 4  # slowest-looking drop patterns (most symbol operations) timed for the worst case
THREAD_TABLE_SCALES = (1, 2, 4)  # block set sizes of the decode thread table, in multiples of --mib
PROG = "psf bench codec"


def build_parser() -> argparse.ArgumentParser:
    """Return the benchmark's argument parser."""
    parser = argparse.ArgumentParser(prog=PROG, description="SAZD codec accuracy and speed next to "
                                     "polynomial codes and a NumPy k-packet sum")
    rep.add_report_options(parser, "codec")
    parser.add_argument("--quick", action="store_true", help="sampled accuracy, 1 MiB speed runs, few repeats: "
                        "a smoke run")
    parser.add_argument("--repeats", type=int, default=None, help="timed repetitions per figure, median kept "
                        "(default 21, quick 5)")
    parser.add_argument("--mib", type=float, default=None, help="float32 MiB per block set in the speed table "
                        "(default 8, quick 1)")
    parser.add_argument("--limit", type=int, default=None, help="most arrival sets per accuracy cell; more are "
                        "sampled with the seed (default 5000, i.e. all for n <= 20; quick 40)")
    parser.add_argument("--pairs", nargs="+", default=None, metavar="N,K", help="(n, k) pairs of the accuracy, "
                        "speed and thread tables (default " + " ".join(f"{n},{k}" for n, k in PAIRS) + "); the "
                        "mixed-precision table always measures psframework.bench.precision.PAIRS (quick: the first "
                        "two)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the data and of sampled arrival sets")
    parser.add_argument("--threads", type=int, default=None, help="SAZD decode threads, and BLAS threads for Poly "
                        "(default: psframework.codes.get_decode_threads(), i.e. PSF_DECODE_THREADS or the usable "
                        "cores, at most 4)")
    return parser


@dataclass(frozen=True)
class Timing:
    """Wall times of repeated calls: the median (the figure reported) and the minimum (the best case)."""

    median: float
    minimum: float


def median_time(fn: Callable[[], Any], repeats: int) -> float:
    """Return the median wall time of `fn()` over `repeats` calls, after one warm-up call."""
    return interleaved_times({"fn": fn}, repeats)["fn"].median


def interleaved_times(fns: Dict[str, Callable[[], Any]], repeats: int) -> Dict[str, Timing]:
    """Time each function, calling them in turn `repeats` times after a warm-up each.

    Interleaving makes slow drifts of the machine hit every figure alike, so ratios stay fair.
    """
    for fn in fns.values():
        fn()
    times: Dict[str, List[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: Timing(statistics.median(values), min(values)) for name, values in times.items()}


def numpy_sum(arrays: Sequence[np.ndarray]) -> Callable[[], np.ndarray]:
    """Return a function summing `arrays` with NumPy into one fresh array, in place after the first add."""
    def run() -> np.ndarray:
        total = np.add(arrays[0], arrays[1]) if len(arrays) > 1 else arrays[0].copy()
        for a in arrays[2:]:
            np.add(total, a, out=total)
        return total
    return run


def accuracy_table(pairs: Sequence[Tuple[int, int]], limit: int, seed: int) -> List[Dict[str, Any]]:
    """Return one row per (code, n, k, L): the worst float32 relative error over arrival sets."""
    rows = []
    for n, k in pairs:
        for name, make in CODES:
            code = make(n, k)
            for symbols in SYMBOLS:
                start = time.perf_counter()
                report = measure_decode_error(code, symbols, dtype=np.float32, width=SYMBOL_WIDTH, limit=limit,
                                              seed=seed)
                rows.append({"code": name, "n": n, "k": k, "L": symbols, "worst_rel_error": report.worst,
                             "worst_packets": list(report.worst_packets), "arrival_sets": report.arrival_sets,
                             "exhaustive": report.exhaustive, "seconds": time.perf_counter() - start})
                print(f"accuracy {name:16s} ({n},{k}) L={symbols:2d}: {report.worst:.3g} over "
                      f"{report.arrival_sets} sets{'' if report.exhaustive else ' (sampled)'}", flush=True)
    add_error_ratios(rows)
    return rows


def add_error_ratios(rows: List[Dict[str, Any]]) -> None:
    """Give every other code's row its error over SAZD's in the same (n, k, L) cell."""
    sazd = {(r["n"], r["k"], r["L"]): r["worst_rel_error"] for r in rows if r["code"] == "SAZD"}
    for row in rows:
        reference = sazd.get((row["n"], row["k"], row["L"]))
        if row["code"] != "SAZD" and reference:
            row["error_over_sazd"] = row["worst_rel_error"] / reference


def drop_patterns(code: SAZDCode, symbols: int, seed: int) -> Tuple[Tuple[int, ...], List[Tuple[int, ...]]]:
    """Return (first n-k systematic packets dropped, the arrival sets most expensive to decode).

    Every arrival set that drops n-k systematic packets uses all parity packets; the ones whose
    schedules do the most symbol operations are returned for timing (from a seeded sample of at most
    200 when there are more).
    """
    n, k = code.n, code.k
    drops = list(itertools.combinations(range(k), n - k))
    if len(drops) > 200:
        drops = random.Random(seed).sample(drops, 200)
    sets = [tuple(sorted(set(range(n)) - set(d))) for d in drops]
    first = tuple(range(n - k, n))
    ranked = sorted(sets, key=lambda s: code.schedule(s, symbols).symbol_ops, reverse=True)
    return first, ranked[:DROP_PATTERNS_TIMED]


def arrival_cases(sazd: SAZDCode, symbols: int, seed: int) -> Dict[str, Tuple[int, ...]]:
    """Return the arrival sets to time by label: all systematic, one dropped, n-k dropped, the costliest."""
    n, k = sazd.n, sazd.k
    cases = {"all systematic": tuple(range(k))}
    if n > k:
        first_drop, expensive = drop_patterns(sazd, symbols, seed)
        cases["1 systematic dropped"] = tuple(j for j in range(k + 1) if j != 0)
        cases[f"first {n - k} systematic dropped"] = first_drop
        for rank, used in enumerate(expensive):
            cases[f"costly set {rank + 1}"] = used
    return cases


def time_codecs(sazd: SAZDCode, poly: PolyCode, blocks: List[np.ndarray], cases: Dict[str, Tuple[int, ...]],
                poly_used: Tuple[int, ...], repeats: int, threads: int) -> Dict[str, Timing]:
    """Time encoding, Poly decoding and SAZD decoding of every arrival set next to its NumPy k-packet sum."""
    import torch

    k, (symbols, width) = sazd.k, blocks[0].shape
    packets = sazd.encode(blocks)
    poly_packets = poly.encode(blocks)
    poly_given = {j: poly_packets[j] for j in poly_used}
    fns: Dict[str, Callable[[], Any]] = {
        "sazd_encode": lambda: sazd.encode(blocks), "poly_encode": lambda: poly.encode(blocks),
        "poly_decode": lambda: poly.decode(poly_given), "numpy_sum_blocks": numpy_sum(blocks)}
    for label, used in cases.items():
        given = {j: packets[j] for j in used}
        fns["decode " + label] = lambda given=given: sazd.decode(given, threads=threads)
        reused = np.empty((k * symbols, width), dtype=np.float32)
        fns["reuse " + label] = lambda given=given, reused=reused: sazd.decode(given, out=reused, threads=threads)
        fns["sum " + label] = numpy_sum([packets[j] for j in used])
    timings = interleaved_times(fns, repeats)
    # torch afterwards and on its own: its worker threads keep spinning after each op, which would slow
    # the NumPy figures interleaved with it on a machine with few cores.
    tensors = [torch.from_numpy(p) for p in packets]  # zero-copy views, for the torch (CPU) figures
    torch_fns: Dict[str, Callable[[], Any]] = {}
    for label, used in cases.items():
        if label.startswith("first") or label == "all systematic":
            torch_given = {j: tensors[j] for j in used}
            torch_fns["torch decode " + label] = lambda given=torch_given: sazd.decode(given, threads=threads)
    timings.update(interleaved_times(torch_fns, repeats))
    return timings


def decode_figures(sazd: SAZDCode, cases: Dict[str, Tuple[int, ...]], symbols: int, timings: Dict[str, Timing],
                   repeats: int) -> Dict[str, Dict[str, Any]]:
    """Return the schedule sizes and decode times of every arrival set, keeping only the slowest costly set."""
    poly_decode = timings["poly_decode"].median
    decode: Dict[str, Any] = {}
    for label, used in cases.items():
        schedule = sazd.schedule(used, symbols)
        case = decode[label] = {
            "packets": list(used), "operations": len(schedule.ops), "symbol_operations": schedule.symbol_ops,
            "levels": schedule.levels,
            "compile_s": median_time(lambda: sazd.schedule(used, symbols, cache=False), max(3, repeats // 4)),
            "decode_s": timings["decode " + label].median, "numpy_sum_s": timings["sum " + label].median,
            "decode_min_s": timings["decode " + label].minimum, "numpy_sum_min_s": timings["sum " + label].minimum,
            "decode_reused_out_s": timings["reuse " + label].median}
        case["ratio_to_numpy_sum"] = case["decode_s"] / case["numpy_sum_s"]
        case["reused_out_ratio_to_numpy_sum"] = case["decode_reused_out_s"] / case["numpy_sum_s"]
        case["poly_over_sazd_decode"] = poly_decode / case["decode_s"]
        if "torch decode " + label in timings:
            case["torch_decode_s"] = timings["torch decode " + label].median
    costly = [label for label in decode if label.startswith("costly")]
    if costly:  # keep the slowest of the costly sets as the worst case
        worst = max(costly, key=lambda label: decode[label]["ratio_to_numpy_sum"])
        decode[f"worst of {sazd.n - sazd.k} systematic dropped"] = decode[worst]
        for label in costly:
            del decode[label]
    return decode


def speed_row(n: int, k: int, symbols: int, mib: float, repeats: int, seed: int, threads: int = 1) -> Dict[str, Any]:
    """Return encode, compile and decode times of SAZD and Poly for one (n, k), with the NumPy references.

    SAZD decodes with `threads` decode threads; Poly gets whatever BLAS threads the caller set.
    """
    sazd, poly = SAZDCode(n, k), PolyCode(n, k, "chebyshev")
    width = max(1, int(round(mib * (1 << 20) / 4 / k / symbols)))
    rng = np.random.default_rng(seed)
    blocks = [rng.standard_normal((symbols, width)).astype(np.float32) for _ in range(k)]
    cases = arrival_cases(sazd, symbols, seed)
    poly_used = cases.get(f"first {n - k} systematic dropped", tuple(range(k)))
    timings = time_codecs(sazd, poly, blocks, cases, poly_used, repeats, threads)
    row: Dict[str, Any] = {"n": n, "k": k, "L": symbols, "block_set_MiB": 4 * k * symbols * width / (1 << 20),
                           "decode_stripes": len(plan_stripes(1, width, 4, threads)),
                           "packet_symbols": symbols + sazd.padding, "sazd_encode_s": timings["sazd_encode"].median,
                           "poly_encode_s": timings["poly_encode"].median,
                           "poly_decode_s": timings["poly_decode"].median,
                           "poly_decode_min_s": timings["poly_decode"].minimum, "poly_decode_packets": list(poly_used),
                           "numpy_sum_blocks_s": timings["numpy_sum_blocks"].median,
                           "sazd_decode": decode_figures(sazd, cases, symbols, timings, repeats)}
    slowest = max(row["sazd_decode"].values(), key=lambda c: c["decode_s"])
    print(f"speed ({n},{k}) L={symbols}: encode {row['sazd_encode_s'] * 1e3:.2f} ms, slowest decode "
          f"{slowest['decode_s'] * 1e3:.2f} ms = {slowest['ratio_to_numpy_sum']:.2f}x the k-packet sum, poly decode "
          f"{row['poly_decode_s'] * 1e3:.2f} ms", flush=True)
    return row


def thread_rows(n: int, k: int, symbols: int, mib: float, repeats: int, seed: int,
                threads: int) -> List[Dict[str, Any]]:
    """Return SAZD decode times of the first n-k systematic dropped set at 1 and at `threads` decode threads.

    One row per block set size in THREAD_TABLE_SCALES; both decodes write into reused outputs, so that
    page faults of fresh outputs (which depend on what ran before) do not blur the speed-up.
    """
    rows = []
    for scale in THREAD_TABLE_SCALES:
        sazd = SAZDCode(n, k)
        width = max(1, int(round(scale * mib * (1 << 20) / 4 / k / symbols)))
        rng = np.random.default_rng(seed)
        packets = sazd.encode([rng.standard_normal((symbols, width)).astype(np.float32) for _ in range(k)])
        given = {j: packets[j] for j in range(n - k, n)}
        one, many = (np.empty((k * symbols, width), dtype=np.float32) for _ in range(2))
        timings = interleaved_times({"1": lambda: sazd.decode(given, out=one, threads=1),
                                     "many": lambda: sazd.decode(given, out=many, threads=threads)}, repeats)
        row = {"n": n, "k": k, "block_set_MiB": 4 * k * symbols * width / (1 << 20), "packets": sorted(given),
               "symbol_KiB": 4 * width / 1024, "stripes": len(plan_stripes(1, width, 4, threads)),
               "one_thread_s": timings["1"].median, "threads_s": timings["many"].median}
        row["speedup"] = row["one_thread_s"] / row["threads_s"]
        rows.append(row)
        print(f"threads ({n},{k}) {row['block_set_MiB']:.0f} MiB: SAZD {row['one_thread_s'] * 1e3:.2f} ms at 1 "
              f"thread, {row['threads_s'] * 1e3:.2f} ms at {threads} ({row['stripes']} stripes)", flush=True)
    return rows


def blas_info() -> Dict[str, Any]:
    """Return the BLAS library NumPy uses, with its thread count before the benchmark limits it."""
    from threadpoolctl import threadpool_info

    for library in threadpool_info():
        if library.get("user_api") == "blas":
            return {"library": library.get("internal_api"), "version": library.get("version"),
                    "default_threads": library.get("num_threads")}
    return {"library": None, "version": None, "default_threads": None}


def machine_info(threads: int) -> Dict[str, Any]:
    """Return what the figures were measured on, with the decode and BLAS threads of the speed tables."""
    import torch

    return {"cpu": cpu_model(), "cores": os.cpu_count(), "platform": platform.platform(), "numpy": np.__version__,
            "torch": torch.__version__, "torch_threads": torch.get_num_threads(), "python": platform.python_version(),
            "openblas_coretype": environment.get("OPENBLAS_CORETYPE"), "decode_threads": threads,
            "blas_threads": threads, "blas": blas_info()}


def _ms(seconds: float) -> str:
    """Return seconds as milliseconds with three decimals."""
    return f"{seconds * 1e3:.3f}"


def _in_order(values: Sequence[Any]) -> List[Any]:
    """Return the distinct values in the order they first appear."""
    return list(dict.fromkeys(values))


def _accuracy_lines(report: Dict[str, Any]) -> List[str]:
    """Return the accuracy table: one row per (n, k) and L, one column per code."""
    rows = report["accuracy"]
    codes = _in_order([r["code"] for r in rows])
    cell = {(r["code"], r["n"], r["k"], r["L"]): r for r in rows}
    width = report["inputs"].get("symbol_width")
    lines = ["## Accuracy: worst relative max error over arrival sets", "",
             "max |decoded - original| / max |original| over all k blocks, worst over every choice of k packets "
             "(cells marked * use a seeded sample of that many choices). Blocks of L symbols"
             + (f", {width} values each." if width else "."), "",
             "| (n,k) | L | sets | " + " | ".join(codes) + " |", "|---|---:|---:|" + "---:|" * len(codes)]
    for n, k, symbols in _in_order([(r["n"], r["k"], r["L"]) for r in rows]):
        first = next(cell[(c, n, k, symbols)] for c in codes if (c, n, k, symbols) in cell)
        sets = f"{first['arrival_sets']}" + ("" if first["exhaustive"] else "*")
        values = " | ".join(f"{cell[(c, n, k, symbols)]['worst_rel_error']:.2g}" if (c, n, k, symbols) in cell
                            else "" for c in codes)
        lines.append(f"| ({n},{k}) | {symbols} | {sets} | {values} |")
    return lines + ["", "The SAZD error grows with L, so `psframework.codes.choose_symbol_size` groups channels "
                    "into symbols to keep L within a budget; polynomial decoding is limited by the conditioning of "
                    "the real Vandermonde system instead, whatever L.", ""]


def _times(value: Optional[float]) -> str:
    """Return a ratio of errors: two decimals below 100, whole numbers above, n/a for none."""
    if value is None:
        return "n/a"
    return f"{value:.2f}" if value < 100 else f"{value:.0f}"


def _conv_mode_text(precision: str, mode: str) -> str:
    """Return how a precision's convolutions were computed."""
    if mode == "native":
        return f"{precision}: torch's CPU convolution in {precision}"
    return (f"{precision}: emulated (this torch build has no CPU {precision} convolution): inputs rounded to "
            f"{precision}, accumulated in fp32, the output rounded to {precision}")


def precision_bound(rows: Sequence[Dict[str, Any]], code: str) -> Optional[float]:
    """Return the largest worst-error-over-own-rounding ratio of a code's mixed-precision rows (None: no rows)."""
    ratios = [r["worst_vs_same_over_own"] for r in rows if r["code"] == code and r["worst_vs_same_over_own"]]
    return max(ratios) if ratios else None


def _precision_intro(table: Dict[str, Any]) -> str:
    """Return what the mixed-precision table measured: the layer, the coding, the errors and the convolutions."""
    layer = table["layer"]
    shape, size = "x".join(str(d) for d in layer["input_shape"]), layer["symbol_size"]
    convs = "; ".join(_conv_mode_text(p, m) for p, m in table["conv_modes"].items())
    threads = table.get("torch_threads")
    return (f"A seeded {layer['in_channels']} -> {layer['out_channels']} channel {layer['kernel']}x{layer['kernel']} "
            f"convolution (padding {layer['padding']}, kaiming-normal weight, seed {layer['seed']}) of an N(0, 1) "
            f"input of shape {shape}, coded along its out-channels ({size} channel{'' if size == 1 else 's'} per "
            "symbol, L symbols per block). Weight and bias are encoded in fp32; worker j convolves with its packet "
            "cast to the precision; the server casts the replies to fp32 and decodes every k-subset of the n "
            "packets. Errors are max |decoded - target| / max |target|, worst (median) over the subsets: *vs same* "
            "against the uncoded convolution computed in the same precision, *vs fp32* against the fp32 "
            "convolution. *Own rounding* is the uncoded low-precision convolution against fp32; the ratios divide "
            "the worst error by it. Convolutions"
            + (f" ({threads} torch thread{'' if threads == 1 else 's'})" if threads else "") + f": {convs}.")


def _precision_lines(report: Dict[str, Any]) -> List[str]:
    """Return the mixed-precision table, where the report has one, and the bound it shows."""
    table = report.get("mixed_precision")
    if not table:
        return []
    rows = table["rows"]
    lines = ["## Mixed precision: workers convolve in bf16 or fp16, the server decodes in fp32", "",
             _precision_intro(table), "",
             "| code | precision | (n,k) | L | subsets | own rounding | vs same: worst (median) | / own | "
             "vs fp32: worst (median) | / own |", "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['code']} | {r['precision']} | ({r['n']},{r['k']}) | {r['L']} | {r['subsets']} | "
                     f"{r['own_rel_error']:.2g} | {r['worst_vs_same']:.2g} ({r['median_vs_same']:.2g}) | "
                     f"{_times(r['worst_vs_same_over_own'])} | {r['worst_vs_fp32']:.2g} ({r['median_vs_fp32']:.2g}) "
                     f"| {_times(r['worst_vs_fp32_over_own'])} |")
    pairs = ", ".join(f"({n},{k})" for n, k in _in_order([(r["n"], r["k"]) for r in rows]))
    precisions = " and ".join(_in_order([r["precision"] for r in rows]))
    bounds = {code: precision_bound(rows, code) for code in _in_order([r["code"] for r in rows])}
    sazd = bounds.pop("SAZD", None)
    others = "; ".join(f"{code} up to {_times(b)}x" for code, b in bounds.items() if b is not None)
    if sazd is not None:
        lines += ["", f"Observed bound: SAZD decoding adds at most {_times(sazd)}x the precision's own rounding "
                  f"(worst over every subset, {precisions}, (n,k) in {pairs})" + (f"; {others}." if others else ".")]
    return lines + [""]


def _stripes_text(report: Dict[str, Any]) -> str:
    """Return when a block set is split into stripes, from the recorded minimum stripe width."""
    least = report["inputs"].get("min_stripe_symbol_bytes")
    return "" if least is None else (f"a block set is split into stripes of columns, one per thread, only where "
                                     f"each gets at least {least // 1024} KiB of every symbol")


def _speed_lines(report: Dict[str, Any]) -> List[str]:
    """Return the encode and decode speed tables."""
    m, speed = report["machine"], report["speed"]
    symbols = ", ".join(str(L) for L in _in_order([row["L"] for row in speed]))
    lines = ["## Speed", "",
             f"A block set of about {speed[0]['block_set_MiB']:.2f} MiB of float32 ({symbols} symbols per block, "
             f"axis 0), times in milliseconds, medians; SAZD with up to {m['decode_threads']} decode threads, Poly "
             f"with {m['blas_threads']} BLAS threads. SAZD packets are L + padding symbols long. *k-packet sum*: "
             "NumPy adding the same k packets the decoder used into a fresh array, measured in the same run. "
             "Compile: working out the zigzag schedule of one arrival set, done once per arrival set and cached; "
             "the decode figures are cached decodes into a fresh output (allocating it costs page faults), and, "
             "where marked, into an output array reused from call to call (`decode(..., out=...)`). Figures on a "
             "shared machine move between runs; the minimum shows the best case.", "",
             "| (n,k) | packet symbols | SAZD encode | Poly encode | Poly decode (min) | k-block sum |",
             "|---|---:|---:|---:|---:|---:|"]
    for row in speed:
        lines.append(f"| ({row['n']},{row['k']}) | {row['packet_symbols']} | {_ms(row['sazd_encode_s'])} | "
                     f"{_ms(row['poly_encode_s'])} | {_ms(row['poly_decode_s'])} ({_ms(row['poly_decode_min_s'])}) | "
                     f"{_ms(row['numpy_sum_blocks_s'])} |")
    lines += ["", "SAZD decoding by arrival set (worst: the slowest of the drop-all-parity sets whose schedules do the "
              "most symbol operations):", "",
              "| (n,k) | arrival set | ops | symbol reads | compile | SAZD decode (min) | k-packet sum (min) | "
              "decode / sum | reused output: decode, / sum | Poly decode / SAZD decode |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in speed:
        for label, case in row["sazd_decode"].items():
            lines.append(f"| ({row['n']},{row['k']}) | {label} {tuple(case['packets'])} | {case['operations']} | "
                         f"{case['symbol_operations']} | {_ms(case['compile_s'])} | {_ms(case['decode_s'])} "
                         f"({_ms(case['decode_min_s'])}) | {_ms(case['numpy_sum_s'])} "
                         f"({_ms(case['numpy_sum_min_s'])}) | "
                         f"{case['ratio_to_numpy_sum']:.2f} | {_ms(case['decode_reused_out_s'])}, "
                         f"{case['reused_out_ratio_to_numpy_sum']:.2f} | {case['poly_over_sazd_decode']:.2f} |")
    return lines + _torch_lines(speed)


def _torch_lines(speed: List[Dict[str, Any]]) -> List[str]:
    """Return the table of decodes on torch tensors, where there are any."""
    rows = [(row, label, case) for row in speed for label, case in row["sazd_decode"].items()
            if "torch_decode_s" in case]
    if not rows:
        return []
    lines = ["", "The same cached decode on torch CPU tensors (zero-copy views of the same packets), timed "
             "after the NumPy figures; CPU tensors decode through NumPy views of their memory, so the "
             "difference is the cost of the views:", "",
             "| (n,k) | arrival set | NumPy | torch |", "|---|---|---:|---:|"]
    return lines + [f"| ({row['n']},{row['k']}) | {label} | {_ms(case['decode_s'])} | {_ms(case['torch_decode_s'])} |"
                    for row, label, case in rows]


def _thread_lines(report: Dict[str, Any]) -> List[str]:
    """Return the decode thread table, where one was measured."""
    if not report.get("threads"):
        return []
    t, stripes = report["machine"]["decode_threads"], _stripes_text(report)
    lines = ["", "## Decode threads", "",
             f"SAZD decoding the first n-k systematic packets dropped with 1 and with {t} decode threads, timed "
             "together, into reused outputs, on the block set above and larger ones. "
             + (f"{stripes[0].upper()}{stripes[1:]}; below that, waking threads costs more than it saves and the "
                "decode runs in the calling thread (1 stripe)." if stripes else ""), "",
             f"| (n,k) | block set MiB | symbol KiB | stripes | 1 thread | {t} threads | speed-up |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for row in report["threads"]:
        lines.append(f"| ({row['n']},{row['k']}) | {row['block_set_MiB']:.0f} | {row['symbol_KiB']:.0f} | "
                     f"{row['stripes']} | {_ms(row['one_thread_s'])} | {_ms(row['threads_s'])} | "
                     f"{row['speedup']:.2f} |")
    return lines


def render(report: Dict[str, Any], expectations: Optional[Dict[str, Any]] = None) -> str:
    """Return the codec benchmark report as Markdown."""
    m, inputs = report["machine"], report["inputs"]
    blas, stripes = m["blas"], _stripes_text(report)
    lines = ["# Codec benchmark", "",
             "SAZD (shift-and-addition coding, compiled zigzag decoding) next to real polynomial codes and a plain "
             "NumPy sum. All data float32, drawn from a standard normal distribution.", "",
             "## Machine", "",
             f"- CPU: {m['cpu']}, {m['cores']} cores, {m['platform']}",
             f"- NumPy {m['numpy']}, torch {m['torch']}, Python {m['python']}"
             + (f", OPENBLAS_CORETYPE={m['openblas_coretype']}" if m.get("openblas_coretype") else ""),
             f"- threads: SAZD decodes with up to {m['decode_threads']} decode threads"
             + (f" ({stripes})" if stripes else "") + f"; Poly decodes with {m['blas_threads']} BLAS threads "
             f"({blas['library']} {blas['version']}, {blas['default_threads']} by default)",
             f"- measured {report['date']}; {inputs['repeats']} timed repeats per speed figure (median), "
             f"accuracy over at most {inputs['limit']} arrival sets per cell (seed {inputs['seed']})", "",
             "Rerun with:", "", "```", report["command"], "```", ""]
    lines += _accuracy_lines(report) + _precision_lines(report) + _speed_lines(report) + _thread_lines(report) + [""]
    return "\n".join(lines + expect.section(report, expectations))


def _pairs(values: Optional[Sequence[str]]) -> List[Tuple[int, int]]:
    if not values:
        return list(PAIRS)
    pairs = []
    for value in values:
        try:
            n, k = (int(v) for v in value.split(","))
        except ValueError:
            raise ValueError(f"--pairs: {value!r} is not N,K") from None
        if not 1 <= k <= n:
            raise ValueError(f"--pairs: {value!r} needs 1 <= k <= n")
        pairs.append((n, k))
    return pairs


def measure(args: argparse.Namespace, argv: List[str]) -> Union[Dict[str, Any], int]:
    """Measure accuracy, speed and decode threads as the options say; return the report (2 on bad options)."""
    repeats = args.repeats if args.repeats is not None else (5 if args.quick else 21)
    mib = args.mib if args.mib is not None else (1.0 if args.quick else 8.0)
    limit = args.limit if args.limit is not None else (40 if args.quick else 5000)
    try:
        pairs = _pairs(args.pairs)
        if repeats < 1 or limit < 1 or not mib > 0:
            raise ValueError(f"--repeats {repeats}, --limit {limit}, --mib {mib}: expected positive values")
        threads = get_decode_threads() if args.threads is None else check_threads(args.threads, "--threads")
    except ValueError as exc:
        return rep.fail(PROG, str(exc))
    from threadpoolctl import threadpool_limits

    from psframework.bench import precision

    machine = machine_info(threads)  # before the limit below, which it reports
    accuracy = accuracy_table(pairs, limit, args.seed)
    with threadpool_limits(threads, "blas"):  # Poly gets as many BLAS threads as SAZD decode threads
        speed = [speed_row(n, k, SPEED_SYMBOLS, mib, repeats, args.seed, threads) for n, k in pairs]
    thread_table = [row for n, k in pairs if n > k
                    for row in thread_rows(n, k, SPEED_SYMBOLS, mib, repeats, args.seed, threads)]
    # torch last, as in time_codecs: its worker threads keep spinning after each op and would slow the timings.
    precision_pairs = precision.PAIRS[:precision.QUICK_PAIRS] if args.quick else list(precision.PAIRS)
    mixed = precision.precision_table(precision_pairs, args.seed)
    inputs = {"pairs": [list(p) for p in pairs], "repeats": repeats, "mib": mib, "limit": limit, "seed": args.seed,
              "quick": args.quick, "symbol_width": SYMBOL_WIDTH, "min_stripe_symbol_bytes": MIN_STRIPE_SYMBOL_BYTES,
              "precision_pairs": [list(p) for p in precision_pairs]}
    return {"benchmark": "codec", "command": rep.command_line(PROG, argv), "machine": machine, "date": rep.today(),
            "inputs": inputs, "accuracy": accuracy, "mixed_precision": mixed, "speed": speed, "threads": thread_table}


def main(argv: Optional[List[str]] = None) -> int:
    """Run the benchmark and write codec.json and codec.md (or re-render with --render); return the status."""
    return rep.main("codec", build_parser(), argv, measure, render)


if __name__ == "__main__":
    raise SystemExit(main())
