"""The tables of the memory-timeline check (``bench/gpu_memory_timeline.py``): the timeline beside the
plan, the per-phase details, the all-gather probe and the plan's own table, and whether the check
passed. Pure: a result dict in, text or a verdict out."""

from __future__ import annotations

NA = "n/a (CPU)"
GIB = 2**30


def _num(gib: float) -> str:
    """GiB with two decimals, or three significant digits below 0.1 (the CPU smoke run's tiny plan)."""
    return f"{gib:.2f}" if gib == 0 or abs(gib) >= 0.1 else f"{gib:.3g}"


def _gib(value: int | float | None, measured: bool = True) -> str:
    if not measured:
        return NA
    return "" if value is None else _num(value / GIB)


def _mib(row: dict, key: str, measured: bool) -> str:
    if not measured:
        return NA
    return "" if row.get(key) is None else f"{row[key] / 2**20:.1f}"


def planned_oom(row: dict) -> bool:
    """A phase that ran out of memory where the plan says it does not fit: the plan's prediction
    confirmed, not a failure of the check."""
    plan = row.get("plan")
    return row["status"].startswith("out of memory") and plan is not None and not plan["fits"]


def markdown(result: dict) -> str:
    """The timeline table, the per-phase details, the probe table and the plan's own table."""
    env, st = result["environment"], result["settings"]
    cuda = env["device"] != "CPU"
    sizes = st["engine_bytes"]
    scale = f" (1/{st['scale']} of the plan's, in host memory)" if st["scale"] != 1 else ""
    count = result.get("parameters") or 0
    params = f"{count / 1e9:.2f}B" if count >= 1e8 else f"{count / 1e6:.3g}M"
    lines = [
        f"Memory timeline of one step: {st['model']}, {params} parameters, recipe {st['recipe']} at TP1 PP1 DP1, "
        f"{st['precision']}, {st['rollouts']} rollouts of {st['prompt_len']} + {st['response_len']} tokens "
        f"(one {st['image_grid'][1]} x {st['image_grid'][2]}-patch image each), micro-batch {st['micro_batch_size']}; "
        f"{env['device']}, torch {env['torch']}, megatron-core {env['megatron-core']}. Plan for "
        f"{st['gpu_memory_gib']:.1f} GiB, rollout.gpu_memory_utilization {st['gpu_memory_utilization']:g}. Engine "
        f"stand-in: weights {sizes['weights'] / GIB:.4g}, KV cache {sizes['kv_cache'] / GIB:.4g}, runtime "
        f"{sizes['runtime'] / GIB:.4g} GiB{scale}. GiB throughout.",
        "",
        "| phase | status | s | peak allocated | allocated after | reserved after | engine stand-in | device used "
        "| plan phase | plan trainer | plan trainer + cache | plan engine | plan total |",
        "| --- | --- | ---: | ---: | ---: | ---: | --- | ---: | --- | ---: | ---: | ---: | ---: |",
    ]
    for r in result["rows"]:
        e = r.get("engine") or {}
        state = e.get("state") or e.get("error", "")
        engine = f"{_gib(e.get('reserved_bytes'))} ({state})" if cuda else f"{NA}: {state}"
        plan = r.get("plan")
        plan_cells = (["—"] * 4 if plan is None else
                      [_num(plan[k]) for k in ("trainer_gib", "reserved_gib", "engine_gib", "total_gib")])
        if plan is not None and not plan["fits"]:
            plan_cells[-1] += " (> GPU)"
        status = f"{r['status']} (the plan: does not fit)" if planned_oom(r) else r["status"]
        lines.append(
            f"| {r['phase']} | {status} | {r['seconds']:.1f} | {_gib(r['peak_allocated_bytes'], cuda)} "
            f"| {_gib(r['allocated_bytes'], cuda)} | {_gib(r['reserved_bytes'], cuda)} | {engine} "
            f"| {_gib(r['device_used_bytes'], cuda)} | {r['plan_phase'] or '—'} | {' | '.join(plan_cells)} |"
        )
    lines.append("")
    for r in result["rows"]:
        d = r.get("details") or {}
        if r["phase"] == "refit" and "tensors" in d:
            lines.append(f"- refit: {d['tensors']} tensors, {d['bytes'] / GIB:.3f} GiB in buckets of "
                         f"{d['bucket_bytes'] / 2**20:g} MiB, {d['gb_per_s']:.2f} GB/s; the stand-in received all of them")
        elif r["phase"].startswith("save ") and "optimizer" in d:
            m, o = d["model"], d["optimizer"]
            lines.append(f"- {r['phase']}: state dict model {m['tensors']} tensors; optimizer {o['tensors']} tensors whose "
                         f"storages hold {o['cuda_bytes'] / GIB:.3f} GiB on the GPU and {o['cpu_bytes'] / GIB:.3f} GiB in host "
                         f"memory (the optimizer's own tensors where not copied; the transient is the peak column)")
        elif r["phase"] == "update" and d:
            lines.append(f"- update: loss {d['actor/loss']:.4g}, grad norm {d['actor/grad_norm']:.4g}")
    sb = result["engine_standin"]
    lines.append(f"- engine stand-in: exit status {sb.get('exit_code')}; calls {sb.get('calls')}")
    lines += ["", "| all-gather probe | backend | ranks | shard MiB | all_gather (list) extra MiB "
              "| all_gather_into_tensor extra MiB | status |", "| --- | --- | ---: | ---: | ---: | ---: | --- |"]
    for p in result["collective_probe"]:
        lines.append(f"| | {p['backend']} | {p['world_size']} | {p['shard_bytes'] / 2**20:g} | {_mib(p, 'list_extra_bytes', cuda)} "
                     f"| {_mib(p, 'flat_extra_bytes', cuda)} | {p['status']} |")
    fmt = st["optimizer_format"]
    lines += ["", f"The plan (checkpoint.optimizer_format={fmt}; python -m fastrl.train --dry-run prints it):", "",
              "```", result["plans"][fmt]["text"], "```"]
    return "\n".join(lines)


def passed(result: dict, phases: tuple[str, ...]) -> bool:
    """Every phase of ``phases`` ran, in order, without error (or out of memory where the plan says it
    does not fit); every probe size ran (or was skipped for time); the stand-in exited with status 0."""
    rows_ok = [r["phase"] for r in result["rows"]] == list(phases) and all(r["status"] == "ok" or planned_oom(r) for r in result["rows"])
    probe_ok = bool(result["collective_probe"]) and all(
        p["status"] == "ok" or p["status"].startswith("skipped") for p in result["collective_probe"])
    return rows_ok and probe_ok and result["engine_standin"].get("exit_code") == 0
