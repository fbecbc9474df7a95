"""Run a hybrid's decode step at every stage of the resident-state plan, count and time it.

    python -m bench.schedule_run                                  # here: scaled-down Bonsai, float32
    python -m bench.schedule_run --geometry full --dtype bfloat16 --matvec kernels --compiled --gdn kernel  # a GPU

One process: the price of one wait and the copy bandwidth (the floor); with ``--matvec kernels`` one token at
stages 5 and 6 checked against the MLX-ops step (``schedule.check_step``; no timing if it fails); the price of
each kind of wait the stage pairs remove, measured between the step's own submissions
(``bench.common.decode_timing.measure_splits``); then ``bench.common.stages.run_stages``: every stage decodes
the same tokens, rounds interleaved (so a shared machine's drift hits every stage alike), its counted waits
checked against ``waits.waits_per_token``. For each stage pair: the measured saving against the table's and the
price model's predictions, and the wait price a least-squares line through (waits, ms a token) implies.

``--geometry cpu`` is Bonsai's 64-layer pattern at about 1/20 of its widths, ``full`` Bonsai-27B's own; weights
are random, one layer's serving every layer of its kind unless ``--distinct`` (a token streams the same bytes
either way). Writes ``data/bench/schedule_run-<device>-<UTC time>.json`` (or ``--out``); needs only numpy and MLX.
"""

from __future__ import annotations

import math
import sys
import time

from bench.common import cli, record
from workbench.decode import MAX_TOKENS

#: The fewest rounds a split kind's price is measured over (``measure_split_between``'s own minimum).
MIN_SPLIT_N = 5


def main(argv: list[str] | None = None) -> dict:
    p = cli.parser(
        "schedule_run",
        __doc__,
        writes=(
            "writes a JSON record to OUT_DIR/schedule_run-<device>-<UTC time>.json (or --out); never replaces an "
            "existing file without --force; also copies it to $OUT when that is set"
        ),
    )
    p.add_argument("--model", default="bonsai-27b", help="a shipped Gated DeltaNet hybrid")
    p.add_argument(
        "--geometry",
        choices=("cpu", "full"),
        default="cpu",
        help="cpu: Bonsai's layer pattern at about 1/20 of its widths; full: the model's own widths",
    )
    p.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), default="float32", help="weights' dtype")
    p.add_argument("--distinct", action="store_true", help="distinct weights for every layer (else one set per kind)")
    p.add_argument("--vocab", type=int, default=None, help="LM head rows (None: the model's, or the cpu geometry's)")
    p.add_argument("--tokens", type=int, default=4, help="tokens a stage decodes per round")
    p.add_argument("--rounds", type=int, default=10, help="rounds, stages interleaved within each")
    p.add_argument("--warmup", type=int, default=3, help="untimed tokens per stage first")
    p.add_argument("--context", type=int, default=32, help="tokens already in each KV cache")
    p.add_argument("--stages", default=None, help="comma-separated stage numbers (None: all)")
    p.add_argument("--price-n", type=int, default=3000, help="waits timed for the price")
    p.add_argument(
        "--budget-s",
        type=float,
        default=360.0,
        help="stop the timed rounds after the first that ends past this many seconds",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    p.add_argument(
        "--gdn",
        choices=("auto", "fast", "ops", "kernel"),
        default="auto",
        help="the recurrence: mx.fast.gated_delta_update (fast), plain MLX ops (ops), or fast if it "
        "runs on this device, else ops, said in the output and the record (auto); kernel: the "
        "whole recurrent step (conv, norms, gates, delta rule, z gate) as ONE launch of the "
        "project's gdn_step kernel (with --matvec kernels only)",
    )
    p.add_argument(
        "--matvec",
        choices=("mlx", "kernels"),
        default="mlx",
        help="every weight's product as MLX ops, or through the project's kernels (CUDA / Metal only: "
        "elsewhere it stops with BackendUnavailable, never falling back)",
    )
    p.add_argument(
        "--quant",
        choices=("none", "affine4", "affine8"),
        default="none",
        help="store every projection quantized (affine4: 4-bit, groups of 64, bf16 scales from --dtype)",
    )
    p.add_argument(
        "--activations",
        choices=("weights", "float32"),
        default="weights",
        help="the mlx path's activations: cast to the weights' dtype, or float32 (the kernels' arithmetic)",
    )
    p.add_argument(
        "--check-tol",
        type=float,
        default=None,
        help="the kernels path's check against the MLX-ops step (None: schedule.CHECK_TOL)",
    )
    p.add_argument(
        "--compiled",
        action="store_true",
        help="each recurrent layer traced once by mx.compile (fewer kernels, less Python a token)",
    )
    p.add_argument(
        "--overlap",
        type=int,
        default=0,
        help="hand a submission to the device every N layers with mx.async_eval (no wait), so the device "
        "runs while the host builds the rest (0: each submission whole at its one wait)",
    )
    p.add_argument("--split-n", type=int, default=20, help="rounds a split kind's price is measured over (0: none)")
    p.add_argument(
        "--in-token-share",
        type=int,
        default=0,
        help="also price each kind of wait inside the token: beside every stage, its token with 1/N of "
        "that kind's waits joined, at the first stage where the kind has N or more (0: not)",
    )
    p.add_argument(
        "--profile",
        action="store_true",
        help="also every stage's kernels and their device time a token, the last stage's in full (PyTorch's "
        "profiler, CUDA only)",
    )
    p.add_argument(
        "--out", type=cli.out_file, default=None, help="write the JSON record to this file instead of OUT_DIR"
    )
    args = p.parse_args(argv)
    for flag, value, least in (
        ("--tokens", args.tokens, 1),
        ("--rounds", args.rounds, 1),
        ("--warmup", args.warmup, 0),
        ("--context", args.context, 1),
        ("--price-n", args.price_n, 10),
        ("--split-n", args.split_n, 0),
        ("--overlap", args.overlap, 0),
        ("--in-token-share", args.in_token_share, 0),
    ):
        if value < least:
            p.error(f"{flag} must be >= {least}; got {value}")
    # The KV caches are allocated whole before the first token (workbench.decode.state.MAX_TOKENS).
    # Every round starts from a new state (bench.common.stages.run_stages), so a cache holds
    # the warm-up's tokens or one round's, never the rounds' together.
    if args.context > MAX_TOKENS or max(args.warmup, args.tokens) + 1 > MAX_TOKENS:
        p.error(
            f"--context, and the larger of --warmup and --tokens, + 1, must each be <= {MAX_TOKENS} (the KV "
            f"caches are allocated whole); got {args.context} and {max(args.warmup, args.tokens) + 1}"
        )
    if 0 < args.split_n < MIN_SPLIT_N:
        p.error(
            f"--split-n must be 0 (no split prices) or >= {MIN_SPLIT_N} (a price is a median of rounds); "
            f"got {args.split_n}"
        )
    if args.seed < 0:
        p.error(f"--seed must be >= 0; got {args.seed}")
    if not math.isfinite(args.budget_s) or args.budget_s < 0:
        p.error(f"--budget-s must be a finite number of seconds >= 0; got {args.budget_s}")
    if args.check_tol is not None and not (math.isfinite(args.check_tol) and args.check_tol > 0):
        p.error(f"--check-tol must be a finite number > 0; got {args.check_tol}")
    if args.out is not None and not args.no_record:
        cli.refuse_existing(p, args.out, args.force)

    from bench.common import decode_timing, step_profile, timing
    from bench.common import stages as stage_timing

    if args.profile:
        try:
            step_profile.check_available()
        except step_profile.ProfileUnavailable as e:
            p.error(f"--profile: {e}")
    from workbench.backends import BackendUnavailable
    from workbench.decode import (
        CHECK_TOL,
        CPU_GEOMETRY,
        Geometry,
        HybridWeights,
        Schedule,
        check_step,
        fast_gdn_available,
        fit_price,
        geometry_of,
        in_token_prices,
        in_token_probes,
        resolve_matvec,
    )
    from workbench.models import load_model
    from workbench.waits import load_plan, measure_wait_price, model_saving, priced_waits

    try:  # kernels without a kernel backend: said now, never a fall back to MLX ops
        resolve_matvec(args.matvec)
    except BackendUnavailable as err:
        p.error(f"--matvec kernels: {err}")
    if args.gdn == "kernel" and args.matvec != "kernels":
        p.error(
            f"--gdn kernel: the gdn_step kernel runs with the project's kernels only (--matvec kernels); "
            f"got --matvec {args.matvec}"
        )

    if args.vocab is not None and args.vocab < 1:
        p.error(f"--vocab must be >= 1, got {args.vocab}")
    try:
        cfg = load_model(args.model)
        geom = geometry_of(cfg, vocab=args.vocab) if args.geometry == "full" else CPU_GEOMETRY
        if args.geometry == "cpu" and args.vocab is not None:
            geom = Geometry(**{**geom.__dict__, "vocab": args.vocab})
    except ValueError as err:
        p.error(f"--model {args.model}: {err}")
    n_attention = len(cfg.attention_layers())
    if n_attention < 1 or len(cfg.layers) - n_attention < 2:
        # The step's split prices are timed between two recurrent layers and around an attention layer.
        p.error(
            f"--model {args.model}: a hybrid with attention layers and at least two recurrent layers is needed; "
            f"it has {n_attention} attention layers of {len(cfg.layers)}"
        )
    try:
        stages = None if args.stages is None else [int(s) for s in args.stages.split(",")]
    except ValueError:
        p.error(f"--stages must be comma-separated stage numbers; got {args.stages!r}")
    plan = load_plan()
    numbers = [st.number for st in plan.stages]
    if stages is not None and (any(n not in numbers for n in stages) or len(set(stages)) != len(stages)):
        p.error(f"--stages must be distinct stage numbers of plan {plan.name!r}, of {numbers}; got {args.stages!r}")

    price = measure_wait_price(n=args.price_n, warmup=max(100, args.price_n // 10))
    print(
        f"device {price['device']} ({price['backend']}, MLX {price['mlx_version']}); "
        f"one wait {price['ms']:.4f} ms (p10 {price['p10_ms']:.4f}, p90 {price['p90_ms']:.4f})",
        flush=True,
    )

    bandwidth = timing.copy_bandwidth(nbytes=1 << 30 if price["backend"] != "cpu" else 1 << 26)
    print(f"copy bandwidth {bandwidth / 1e9:.0f} GB/s (chained x + 1 over float32, read + write, marginal)", flush=True)

    t0 = time.perf_counter()
    quant = None if args.quant == "none" else args.quant
    wts = HybridWeights(cfg, geom, dtype=args.dtype, seed=args.seed, share=not args.distinct, quant=quant)
    gdn, why = args.gdn, ""
    # The MLX-ops recurrence: the run's own when asked for by "auto", and the check's
    # reference when the run's is the gdn_step kernel.
    ok, why = fast_gdn_available() if gdn in ("auto", "kernel") else (gdn == "fast", "")
    ref_gdn = gdn if gdn in ("fast", "ops") else ("fast" if ok else "ops")
    if gdn == "auto":
        gdn = ref_gdn
        if not ok:
            print(f"mx.fast.gated_delta_update does not run here ({why}); the recurrence runs as plain MLX ops")
    sched = Schedule(
        cfg,
        wts,
        gdn=gdn,
        matvec=args.matvec,
        activations=args.activations,
        compiled=args.compiled,
        overlap=args.overlap,
    )
    weight_bytes = wts.bytes_per_token()
    floor_ms = weight_bytes / bandwidth * 1e3
    print(f"weights ready in {time.perf_counter() - t0:.1f} s; eligible layers {list(sched.eligible)}", flush=True)
    print(
        f"matvecs: {sched.mv.describe()}; {weight_bytes / 1e9:.2f} GB of weights a token, floor {floor_ms:.3f} ms",
        flush=True,
    )

    check = None
    if args.matvec == "kernels":
        ref = Schedule(cfg, wts, gdn=ref_gdn, matvec="mlx", activations="float32")
        check = check_step(
            sched, ref, context=args.context, tol=args.check_tol if args.check_tol is not None else CHECK_TOL
        )
        for r in check["stages"]:
            print(
                f"check stage {r['stage']}: worst scaled error {r['worst_scaled_error']:.2e} "
                f"(tol {check['tol']:.0e}) {'PASS' if r['passed'] else 'FAIL'}",
                flush=True,
            )
        del ref

    splits: list = []
    if args.split_n and (check is None or check["passed"]):
        splits = decode_timing.measure_splits(sched, n=args.split_n, context=args.context)
        print(f"\n{'split':<12} {'price ms':>9} {'p10':>8} {'p90':>8} {'split ms':>9} {'joined ms':>10}")
        for r in splits:
            print(
                f"{r['split']:<12} {r['ms']:>9.4f} {r['p10_ms']:>8.4f} {r['p90_ms']:>8.4f} {r['split_ms']:>9.4f} "
                f"{r['joined_ms']:>10.4f}",
                flush=True,
            )
    split_prices = {r["split"]: r["ms"] for r in splits} or None
    split_rounds = {r["split"]: r["diffs_ms"] for r in splits} or None

    try:
        from tqdm.auto import tqdm

        bar = tqdm(total=args.rounds, desc="rounds", leave=False, file=sys.stderr)
    except ImportError:  # a GPU machine may have only numpy and MLX
        bar = None

    def progress(r: int, n: int) -> None:
        if bar is None:
            print(f"  round {r}/{n}", flush=True)
        else:
            bar.total = n
            bar.update(r - bar.n)

    probes, joined = {}, {}
    if args.in_token_share:
        probes, joined = in_token_probes(sched, stages if stages is not None else numbers, args.in_token_share)
        print(f"in-token probes: {list(probes) or 'none (no kind has enough waits in the stages timed)'}", flush=True)

    timed = check is None or check["passed"]
    if not timed:
        print("the check failed: nothing is timed", flush=True)
        run = {"stages": [], "rounds_run": 0, "comparisons": []}
    else:
        run = stage_timing.run_stages(
            sched,
            stages=stages,
            tokens=args.tokens,
            rounds=args.rounds,
            warmup=args.warmup,
            context=args.context,
            price_ms=price["ms"],
            progress=progress,
            time_budget_s=args.budget_s,
            split_prices=split_prices,
            split_rounds=split_rounds,
            probes=probes or None,
        )
    if bar is not None:
        bar.close()
    rows = run["stages"]
    in_token = None
    if joined and run.get("probes"):
        in_token = in_token_prices(rows, run["probes"], joined)
        prices_in_token = {**(split_prices or {}), **{k: v["ms"] for k, v in in_token.items()}}
        for c in run["comparisons"]:
            m = model_saving(cfg, c["from"], c["to"], prices_in_token, price["ms"], eligible=sched.eligible)
            c["ms_saved_model_in_token"] = m["ms"]
        print(f"\n{'kind':<16} {'in-token ms':>12} {'95% interval':>18} {'alone ms':>9}  (joined at stage, count)")
        for k, v in in_token.items():
            alone = (split_prices or {}).get(k, float("nan"))
            print(
                f"{k:<16} {v['ms']:>12.4f} {v['lo_ms']:>8.4f}-{v['hi_ms']:<9.4f} {alone:>9.4f}  "
                f"({v['stage']}, {v['count']})",
                flush=True,
            )
    fit = fit_price(rows) if len({r["waits_predicted"] for r in rows}) > 1 else None
    for r in rows:
        r["x_floor"] = r["ms_median"] / floor_ms
        if split_prices is not None:
            model = priced_waits(cfg, r["stage"], split_prices, price["ms"], eligible=sched.eligible)
            r["ms_waits_model"] = model["ms"]
            r["wait_share_model"] = min(1.0, model["ms"] / r["ms_median"])

    print(
        f"\n{'stage':>5} {'waits':>6} {'made':>6} {'ms/token':>9} {'p10':>8} {'p90':>8} {'x floor':>8} "
        f"{'waits ms':>9} {'in eval':>8} {'host':>7}  name"
    )
    for r in rows:
        print(
            f"{r['stage']:>5} {r['waits_predicted']:>6} {str(r['waits_made']):>6} {r['ms_median']:>9.3f} "
            f"{r['ms_p10']:>8.3f} {r['ms_p90']:>8.3f} {r['x_floor']:>8.2f} "
            f"{r.get('ms_waits_model', float('nan')):>9.3f}"
            f" {r['ms_eval_median']:>8.3f} {r['ms_host_median']:>7.3f}  {r['name']}"
        )
    print(f"floor {floor_ms:.3f} ms ({weight_bytes / 1e9:.2f} GB at {bandwidth / 1e9:.0f} GB/s)")
    print(
        f"\n{'from':>4} {'to':>3} {'saved':>6} {'predicted ms':>13} {'model ms':>9} {'measured ms':>12} {'ratio':>6} "
        f"{'paired ms':>10} {'ratio':>6} {'model':>6}"
    )
    fmt = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
    for c in run["comparisons"]:
        print(
            f"{c['from']:>4} {c['to']:>3} {c['waits_saved']:>6} {c['ms_saved_predicted']:>13.3f} "
            f"{c.get('ms_saved_model', float('nan')):>9.3f} {c['ms_saved_measured']:>12.3f} {fmt(c['ratio']):>6} "
            f"{c.get('ms_saved_paired', float('nan')):>10.3f} {fmt(c.get('ratio_paired')):>6} "
            f"{fmt(c.get('ratio_model_paired', c.get('ratio_model'))):>6}"
        )
    if fit is not None:
        print(
            f"\nprice a wait: measured {price['ms']:.4f} ms; fitted from the stages {fit['ms_per_wait']:.4f} ms "
            f"(intercept {fit['intercept_ms']:.3f} ms a token)"
        )

    profile = None
    if args.profile and rows:
        # Every stage's kernels and their device time a token. The price model prices the
        # waits a stage removes and assumes the same kernel time in every stage; on MLX's
        # CUDA back-end the same kernels can take longer where the host touches more of the
        # buffers they read (managed memory, docs/GPU.md), so the record keeps each stage's
        # kernel time beside its clock (workbench.reports.schedule_run.pair_table splits each
        # saving into the two). The last stage (one wait a token) keeps its whole profile.
        from workbench.decode import new_state

        last = max(r["stage"] for r in rows)
        print(f"\n{'stage':>5} {'kernels':>8} {'device ms':>10}  ({args.tokens} tokens profiled a stage)")
        for r in rows:
            n = r["stage"]
            state = new_state(wts, context=args.context, max_new=args.warmup + args.tokens + 1)
            for _ in range(args.warmup):
                sched.step(state, n)
            prof = step_profile.device_profile(
                lambda s=state, n=n: [sched.step(s, n) for _ in range(args.tokens)], args.tokens
            )
            r["device_ms_per_token"] = prof["device_us_per_step"] / 1e3
            r["kernels_per_token"] = prof["kernels_per_step"]
            r["top_kernels"] = prof["top_kernels"][:6]  # where a stage's kernel time goes
            print(f"{n:>5} {prof['kernels_per_step']:>8.1f} {prof['device_us_per_step'] / 1e3:>10.3f}", flush=True)
            if n == last:
                profile = {"stage": last, **prof}
        print(
            f"\nstage {last}: {profile['kernels_per_step']:.1f} kernels a token, "
            f"{profile['device_us_per_step'] / 1e3:.3f} ms of device time a token (floor {floor_ms:.3f} ms)"
        )
        for k in profile["top_kernels"]:
            print(f"  {k['us_per_step'] / 1e3:8.3f} ms {k['per_step']:7.1f}x  {k['name'][:90]}")

    rec = {
        "bench": "schedule_run",
        "command": " ".join(["python -m bench.schedule_run"] + (argv if argv is not None else sys.argv[1:])),
        "date": price["date"],
        "device": price["device"],
        "backend": price["backend"],
        "mlx_version": price["mlx_version"],
        "model": cfg.name,
        "geometry": args.geometry,
        "geometry_values": dict(geom.__dict__),
        "dtype": args.dtype,
        "quant": quant,
        "matvec": sched.matvec,
        "matvec_detail": sched.mv.describe(),
        "compiled": sched.compiled,
        "overlap": sched.overlap,
        "copy_bandwidth_gbs": bandwidth / 1e9,
        "floor_ms": floor_ms,
        "check": check,
        "splits": splits,
        "weights": "distinct per layer"
        if args.distinct
        else "one set per layer kind, reused by every layer of that kind",
        "weight_bytes_per_token": int(weight_bytes),
        "weight_bytes_note": "every layer's stored arrays (codes, scales and biases where quantized), the final norm "
        "and the LM head; recurrent states and KV caches not included",
        "eligible": list(sched.eligible),
        "gdn": {
            "fast": "mx.fast.gated_delta_update",
            "kernel": "the gdn_step kernel (workbench.kernels.gdn_step): the recurrent step as one launch; checked "
            f"against {'mx.fast.gated_delta_update' if ref_gdn == 'fast' else 'layers.gated_delta_ops'}",
        }.get(gdn, f"layers.gated_delta_ops (plain MLX ops){'; fast op: ' + why if why else ''}"),
        "tokens_per_round": args.tokens,
        "rounds": run["rounds_run"],
        "warmup": args.warmup,
        "context": args.context,
        "price": {k: price[k] for k in ("ms", "p10_ms", "p90_ms", "iqr_ms", "eval_only_ms", "n", "method")},
        "stages": rows,
        "comparisons": run["comparisons"],
        "probes": run.get("probes", []),
        "in_token_prices": in_token,
        "fit": fit,
        "all_waits_match": bool(rows) and all(r["waits_match"] for r in rows),
        "device_profile": profile,
    }
    if not args.no_record:
        out = (
            args.out
            if args.out is not None
            else args.out_dir / (record.record_stem("schedule_run", price["device"]) + ".json")
        )
        record.write(rec, out.parent, out.stem, force=args.force)
    return rec


if __name__ == "__main__":
    sys.exit(cli.run(main, prog="python -m bench.schedule_run"))
