"""What one ``mx.fast.cuda_kernel`` launch costs the host, and what in a launch sets it (CUDA).

    python -m experiments.launch_host_cost                 # 30 launches a chain, 200 chains
    python -m experiments.launch_host_cost --links 30 --repeats 100

Why this exists: a small model's decode on the H200 is bound by the host (``bench.real_model``
splits a step into building its graph, encoding it and waiting), and there the tail as one
launch costs the host several ordinary ops' worth. MLX 0.32's CUDA custom kernel rebuilds its
source on every call and hashes it on every evaluation, and hands every input to the
launch, so three things may set the price: the text's length, the number of inputs, and
whether the call goes through ``mx.compile``. This experiment separates them on a kernel
that does nearly nothing (``launch_host_cost.cu``: one add an element), so every variant's
time is host time:

- ``ops``: the chain as plain MLX adds (the price of an ordinary op, for scale);
- ``k<N>``: the kernel with ``N`` inputs (``x``, ``after`` and ``N - 2`` small arrays it never
  reads), its text as short as it gets;
- ``k<N>-pad<K>k``: the same kernel behind a header of about ``K`` kB of unused device
  functions (``launch_host_cost.cuh``'s one line repeated: text length alone; the one-launch tail
  hands MLX about 25 kB without its
  comments, 57 kB with them);
- ``...-compiled``: the call traced once by ``mx.compile``.

Each variant builds a chain of ``--links`` launches (each taking the previous output as
``after``, as the tail's launches are ordered), hands it to the device (``mx.async_eval``:
the encoding, on this thread) and waits for it; per launch, the medians over
``--repeats`` chains, variants interleaved chain by chain. Every chain's result is checked
exactly (``links * x``: integers in float32). A record (device, date, MLX version, command)
goes to ``data/bench/``. Needs MLX's CUDA backend (exit 2 without it).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import cli, record

#: The kernel's body (the source handed to MLX after any padding header).
BODY = (Path(__file__).with_suffix(".cu")).read_text()

#: The padding's one function (``launch_host_cost.cuh``'s code line), ``PAD_INDEX`` to fill in.
PAD_LINE = (
    next(
        line
        for line in Path(__file__).with_suffix(".cuh").read_text().splitlines()
        if line.strip() and not line.startswith("//")
    )
    + "\n"
)

#: Elements a launch: a kernel of one small group.
ELEMENTS = 256

#: The variants: (inputs, padding in kB, compiled).
VARIANTS: dict[str, tuple[int, int, bool]] = {
    "k2": (2, 0, False),
    "k2-pad25k": (2, 25, False),
    "k2-pad57k": (2, 57, False),
    "k20": (20, 0, False),
    "k20-pad25k": (20, 25, False),
    "k2-compiled": (2, 0, True),
    "k20-compiled": (20, 0, True),
    "k20-pad25k-compiled": (20, 25, True),
}


def padding(kb: int) -> str:
    """About ``kb`` kB of device functions no kernel calls: text for MLX to carry and hash."""
    if kb == 0:
        return ""
    lines, size, i = [], 0, 0
    while size < kb * 1000:
        lines.append(PAD_LINE.replace("PAD_INDEX", str(i)))
        size += len(lines[-1])
        i += 1
    return "".join(lines)


def make_variant(mx: Any, inputs: int, pad_kb: int, compiled: bool, x: Any) -> Callable[[Any], Any]:
    """A function ``after -> out`` that launches the kernel once with ``inputs`` inputs."""
    names = ["x", "after"] + [f"c{j}" for j in range(inputs - 2)]
    kernel = mx.fast.cuda_kernel(
        name=f"launch_host_cost_{inputs}_{pad_kb}",
        input_names=names,
        output_names=["out"],
        source=BODY,
        header=padding(pad_kb),
        ensure_row_contiguous=True,
    )
    extra = [mx.full((64,), float(j), dtype=mx.float32) for j in range(inputs - 2)]
    mx.eval(*extra)

    def launch(after: Any) -> Any:
        return kernel(
            inputs=[x, after, *extra],
            template=[("N", ELEMENTS)],
            grid=(ELEMENTS, 1, 1),
            threadgroup=(ELEMENTS, 1, 1),
            output_shapes=[(ELEMENTS,)],
            output_dtypes=[mx.float32],
        )[0]

    return mx.compile(launch) if compiled else launch


def run(links: int, repeats: int) -> dict[str, Any]:
    import mlx.core as mx

    x = mx.arange(ELEMENTS, dtype=mx.float32)
    zero = mx.zeros((ELEMENTS,), dtype=mx.float32)
    mx.eval(x, zero)
    fns: dict[str, Callable[[Any], Any]] = {"ops": lambda a: x + a}
    for name, (n, pad, comp) in VARIANTS.items():
        fns[name] = make_variant(mx, n, pad, comp, x)
    want = links * np.arange(ELEMENTS, dtype=np.float32)
    times: dict[str, list[tuple[float, float, float]]] = {k: [] for k in fns}
    checks: dict[str, bool] = {k: True for k in fns}
    for rep in range(repeats + 3):  # three chains a variant first, untimed: compilation, caches
        for name, fn in fns.items():
            t0 = time.perf_counter()
            out = zero
            for _ in range(links):
                out = fn(out)
            t1 = time.perf_counter()
            mx.async_eval(out)
            t2 = time.perf_counter()
            got = np.array(out)
            t3 = time.perf_counter()
            checks[name] = checks[name] and bool(np.array_equal(got, want))
            if rep >= 3:
                times[name].append((t1 - t0, t2 - t1, t3 - t2))
    variants = {}
    for name, ts in times.items():
        a = np.asarray(ts) * 1e6
        build, encode, wait = (float(np.median(a[:, j])) for j in range(3))
        spec = VARIANTS.get(name)
        variants[name] = {
            "inputs": None if spec is None else spec[0],
            "pad_kb": None if spec is None else spec[1],
            "compiled": None if spec is None else spec[2],
            "build_us_per_launch": build / links,
            "encode_us_per_launch": encode / links,
            "wait_us_per_chain": wait,
            "host_us_per_launch": (build + encode) / links,
            "check_passed": checks[name],
        }
    return {
        "links": links,
        "repeats": repeats,
        "elements": ELEMENTS,
        "variants": variants,
        "all_checks_passed": all(checks.values()),
    }


def print_table(res: dict[str, Any]) -> None:
    ops = res["variants"]["ops"]["host_us_per_launch"]
    print(f"{res['links']} launches a chain, medians of {res['repeats']} chains; host us a launch")
    print(f"{'variant':<22}{'build':>8}{'encode':>8}{'host':>8}{'x an op':>9}{'wait us':>9}{'exact':>7}")
    for name, v in res["variants"].items():
        print(
            f"{name:<22}{v['build_us_per_launch']:>8.2f}{v['encode_us_per_launch']:>8.2f}"
            f"{v['host_us_per_launch']:>8.2f}{v['host_us_per_launch'] / ops:>9.2f}{v['wait_us_per_chain']:>9.1f}"
            f"{str(v['check_passed']):>7}"
        )


def main(argv: list[str] | None = None) -> int:
    ap = cli.parser("launch_host_cost", __doc__)
    ap.prog = "python -m experiments.launch_host_cost"
    ap.add_argument("--links", type=int, default=30, help="launches a chain (a model's layers)")
    ap.add_argument("--repeats", type=int, default=200, help="timed chains a variant")
    a = ap.parse_args(argv)
    for flag, v in (("--links", a.links), ("--repeats", a.repeats)):
        if v < 1:
            ap.error(f"{flag} must be >= 1; got {v}")
    import mlx.core as mx

    if not mx.cuda.is_available():
        print("MLX's CUDA backend is not available here: this experiment launches CUDA kernels on an NVIDIA GPU")
        return 2
    prov = record.provenance("launch_host_cost", argv)
    prov["command"] = prov["command"].replace("python -m bench.", "python -m experiments.", 1)
    res = run(a.links, a.repeats)
    print_table(res)
    rec = {"what": "what one mx.fast.cuda_kernel launch costs the host: text length, inputs, mx.compile", **prov, **res}
    if not a.no_record:
        device = prov["device"].get("device_name", "gpu")
        print(f"record: {record.write(rec, a.out_dir, record.record_stem('launch_host_cost', device), force=a.force)}")
    return 0 if res["all_checks_passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
