"""Replicates: one verb's run repeated over mask seeds or fine-tune replicates, and the stability and paired
statistics across them.

Its one job is the "several runs as one" of ``--seeds`` and ``--finetuned-replicates``: it runs a single-run flow
once per seed or fine-tune (the flow is an argument, so this module sits below the verbs that call it), reads back
what an interrupted run of the same request already wrote, and reports the runs together: how alike their regions
are against chance, their core and union, and every figure as a mean over runs with its spread and paired
differences. It also groups region files that are replicates of one experiment (``replicate_groups``,
``finetune_replicates``).
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, replace
from pathlib import Path

from .. import card, metrics, regions, sets, settings
from ..config import FT_LABEL
from ..errors import Cancelled, Paused, RegionError, RequestError
from ..paths import short_ref
from ..regions import RegionRecord
from ..requests import LocalizeRequest, Request
from .common import LOCAL, Guard, LocalizeResult, Result, finish, load_region, part_progress, region_stem, save_new


# -- localize over seeds and fine-tunes ------------------------------------------------------------
SPEED_ONLY = ("memory", "checkpoint_every", "overwrite", "check_n",  # how a run goes, not what it finds; nor how its
              "answer_regex", "ignore_case", "whole_generation", "max_new_tokens",  # quick check judges generations
              "ignore_punctuation", "ignore_regex", "answer_whitespace")


def _same_request(made: dict | None, asked: Request) -> bool:
    if not isinstance(made, dict):
        return False
    saved = {**json.loads(json.dumps(type(asked).defaults())), **made}  # a field added since counts as its default
    want = json.loads(json.dumps(asked.as_dict()))
    return {k: v for k, v in saved.items() if k not in SPEED_ONLY} == {k: v for k, v in want.items() if k not in SPEED_ONLY}


def _earlier_seed(one: LocalizeRequest) -> RegionRecord | None:
    """The seed's (or fine-tune's) region from an earlier run of this very request (an interrupted replicate run), if
    its file is there; a file made otherwise is refused unless --overwrite."""
    path = Path(one.out).expanduser() if one.out else None
    if path is None or not path.exists():
        return None
    try:
        record = regions.load(path)
    except RegionError:
        record = None
    if record is not None and _same_request(record.meta.request, one):
        return record
    if not one.overwrite:
        raise RequestError(f"'{one.out}' exists and was not made by this request with seed {one.seed}; choose another "
                           "--out, or add --overwrite to replace it")
    return None


def _module_stability(records: list[RegionRecord]) -> dict:
    """Per module type: the parameters every seed found against a seed's mean count there, and against chance."""
    return sets.stability_by_part([r.indices for r in records], records[0].shapes)["by_module"]


def _seed_record(records: list[RegionRecord], indices: dict, how: str, req: LocalizeRequest) -> RegionRecord:
    """The core or the union of the seeds' regions as one region (a skill patch when the seeds' are)."""
    first = records[0]
    values = head = None
    if all(r.is_patch for r in records):  # one fine-tuned model: every seed holds the same value at an index
        values = sets.union_values([sets.Contribution(str(i), r.indices, r.values) for i, r in enumerate(records)],
                                   {}, "first")[1]
        merged = sets.union(*(r.indices for r in records))
        values = {n: values[n][sets._isin(merged[n], idx)] for n, idx in indices.items()}
        head = first.head
    counts = {r.meta.train_examples for r in records}  # each seed's mask learning read the same examples
    learn = first.meta.learn if not isinstance(first.meta.learn, dict) else \
        {**{k: v for k, v in first.meta.learn.items() if k != "seed"}, "seeds": list(req.seeds)}
    made = {"method": how, "sources": [str(s) for s in req.seeds], "source_methods": [req.method],
            "task": first.meta.task, "request": None, "learn": learn,
            "train_examples": counts.pop() if len(counts) == 1 else None,
            "notes": [f"the {how} of the regions of seeds {', '.join(map(str, req.seeds))}"]}
    return regions.derived_record(first.meta, indices, first.shapes, made, values, head)


def _holds(path: Path, indices: dict) -> bool:
    try:
        return regions.digest(regions.load(path).indices) == regions.digest(indices)
    except RegionError:
        return False


def localize_seeds(localize, req: LocalizeRequest, progress=None, cancel=None,
                   guard: Guard = LOCAL) -> LocalizeResult:
    """``localize`` run once per seed: one region per seed (each the region ``--seed N`` finds, bit for bit), their
    stability against chance, and their core and union as region files. A seed whose file an earlier run of this
    request wrote is read back, so a cancelled run resumes where it stopped; the seeds it finished stay on disk."""
    start = time.time()
    outs = req.seed_outs()
    found: list[tuple[int, RegionRecord, str, bool, float]] = []
    checks: dict[int, dict | None] = {}  # each learned seed's quick held-out check
    notes: list[str] = []
    for i, (seed, out) in enumerate(outs.items()):
        one = req.replace(seed=seed, seeds=None, out=out)  # every field carried: --check-n 0 checks no seed
        earlier = _earlier_seed(one)
        if earlier is not None:
            found.append((seed, earlier, str(Path(out).expanduser()), True, 0.0))
            if progress:
                progress({"stage": f"seed {seed} ({i + 1}/{len(outs)}): read back from {Path(out).name}",
                          "fraction": (i + 1) / len(outs), "seed": seed})
            continue
        try:
            result = localize(one, part_progress(progress, i, len(outs), seed), cancel, guard)
        except Paused:  # stopped to continue elsewhere: the job runs again, reading back the seeds it finished
            raise
        except Cancelled:
            kept = ", ".join(f"seed {s} ({Path(p).name})" for s, _, p, _, _ in found)
            raise Cancelled("localization cancelled" + (f"; kept {kept}: run it again with the same --out to go on"
                                                        if kept and req.out else f"; kept {kept}" if kept else "")) \
                from None
        found.append((seed, result.record, result.path, False, result.seconds))
        checks[seed] = result.check
        notes += [n for n in result.notes if n not in notes]
    records = [r for _, r, _, _, _ in found]
    seeds = [{"seed": s, "path": p, "k": r.size, "reused": reused, "seconds": round(secs, 1),
              "top_movement_overlap": r.meta.top_movement_overlap, "check": _held_out(checks.get(s))}
             for s, r, p, reused, secs in found]
    if len(records) == 1:  # one seed's region is its own core and union: nothing more to write or compare
        notes.append(f"one seed ({found[0][0]}): its region is written alone; give two or more --seeds for their core, "
                     "union and stability")
        finish(progress)
        return LocalizeResult(req, notes, time.time() - start, found[0][2], records[0], seeds, None)
    core, union = sets.core([r.indices for r in records]), sets.union(*(r.indices for r in records))
    stability = {**sets.stability([r.indices for r in records], records[0].graftable),
                 "by_module": _module_stability(records), "core_path": None, "union_path": None}
    folder = Path(req.out).expanduser().parent if req.out else settings.subdir("regions")
    stem = Path(req.out).stem if req.out else region_stem(req.finetuned, req.task, req.method, records[0].size)
    for how, indices in (("core", core), ("union", union)):
        if not sets.region_size(indices):
            notes.append("no parameter was found by every seed: there is no core region to write")
            continue
        record = _seed_record(records, indices, how, req)
        target = folder / f"{stem}-{how}.safetensors"
        if req.out and target.exists() and not req.overwrite and _holds(target, indices):
            pass  # written by the interrupted run this one resumes
        elif req.out and (req.overwrite or not target.exists()):
            regions.save(record, target, exclusive=not req.overwrite)
        else:
            target = save_new(record, folder, f"{stem}-{how}")
        stability[f"{how}_path"] = str(target)
    finish(progress)
    return LocalizeResult(req, notes, time.time() - start, found[0][2], records[0], seeds, stability)


def localize_finetunes(localize, req: LocalizeRequest, progress=None, cancel=None,
                       guard: Guard = LOCAL) -> LocalizeResult:
    """``localize`` run once per fine-tune: the region of each fine-tune of one recipe (--finetuned and its replicates;
    with --seeds, each seed's on each), written as '<out>-ft<i>', and how alike the fine-tunes' regions are against
    chance: is the skill in the same place whichever fine-tune carries it? The result is the first fine-tune's, with the
    others under ``finetunes``. The stability compares one seed's region per fine-tune (the first seed), so that it
    measures the fine-tunes alone; each fine-tune's seeds have their own under ``finetunes``. A fine-tune whose file an
    earlier run of this request wrote is read back, so a cancelled run resumes; the fine-tunes it finished stay on
    disk."""
    start, runs, refs = time.time(), [], req.finetunes()
    for i, ref in enumerate(refs):
        one = req.replace(finetuned=ref, finetuned_replicates=None, out=req.finetune_out(i))
        earlier = None if one.seeds else _earlier_seed(one)
        if earlier is not None:
            runs.append(LocalizeResult(one, [], 0.0, str(Path(one.out).expanduser()), earlier))
            continue
        try:
            runs.append(localize(one, part_progress(progress, i, len(refs), None, f"fine-tune {short_ref(ref)}"),
                                 cancel, guard))
        except Paused:
            raise
        except Cancelled:
            kept = ", ".join(Path(r.path).name for r in runs)
            raise Cancelled("localization cancelled" + (f"; kept {kept}: run it again with the same --out to go on"
                                                        if kept and req.out else "")) from None
    records = [r.record for r in runs]
    if len({r.graftable for r in records}) > 1:
        raise RegionError("the fine-tunes have different graftable parameters: they are not fine-tunes of one base")
    stability = {**sets.stability([r.indices for r in records], records[0].graftable),
                 "by_module": _module_stability(records)}
    finetunes = [{"finetuned": ref, "path": r.path, "k": r.k, "seconds": round(r.seconds, 1),
                  "seeds": r.seeds, "stability": r.stability, "check": _held_out(r.check)} for ref, r in zip(refs, runs)]
    notes = list(dict.fromkeys(n for r in runs for n in r.notes))
    return replace(runs[0], request=req, notes=notes, seconds=time.time() - start, finetunes=finetunes,
                   finetune_stability=stability)


def _held_out(check: dict | None) -> dict | None:
    """A seed's quick check in brief: its region's and FT's held-out accuracy on the same n examples."""
    if not check:
        return None
    rows = {r["model"]: r["accuracy"] for r in check["rows"]}
    return {"n": check["n"], "accuracy": rows.get("this region"), "ft": rows.get(FT_LABEL)}


# -- any verb over seeds ---------------------------------------------------------------------------
def each_seed(flow, req, progress, cancel, guard, *, out_folders: bool = False) -> list:
    """``flow`` run once per seed of ``req.seeds`` (the request otherwise unchanged), progress shown per seed. With
    ``out_folders`` a seed writes into its own new folder ``<out>/seed<N>`` of the request's output folder."""
    runs = []
    for i, seed in enumerate(req.seeds):
        if cancel is not None and cancel.is_set():
            raise Cancelled("cancelled")
        one = req.replace(seed=seed, seeds=None)
        if out_folders and req.out:
            one = one.replace(out=str(Path(req.out).expanduser() / f"seed{seed}"))
        runs.append(flow(one, part_progress(progress, i, len(req.seeds), seed), cancel, guard))
    finish(progress)
    return runs


def replicated(runs: list, req, figures: tuple[str, ...], kept: tuple[str, ...] = ()):
    """Several seeds' results as one: each of ``figures`` the mean over seeds (its std in ``spread``, each seed's
    own under ``per_seed`` with the ``kept`` fields, such as the region files it wrote), paired differences over
    seeds with both noises in their interval (``metrics.differences_over_seeds``)."""
    means, spread = {}, {}
    for name in figures:
        means[name], spread[name] = metrics.mean_nested([getattr(r, name) for r in runs])
    if hasattr(runs[0], "differences"):
        means["differences"] = metrics.differences_over_seeds([r.differences for r in runs])
    per_seed = [{"seed": seed, **{name: getattr(r, name) for name in (*figures, *kept, "differences")
                                  if hasattr(r, name)}} for seed, r in zip(req.seeds, runs)]
    notes = list(dict.fromkeys(note for r in runs for note in r.notes))
    return replace(runs[0], request=req, notes=notes, seconds=sum(r.seconds for r in runs), **means, spread=spread,
                   seeds=list(req.seeds), per_seed=per_seed)


def per_seed_rows(seeds, runs) -> list[dict]:
    """Each seed's own rows and differences, as its single run gave them."""
    return [{"seed": seed, "rows": run.rows, "differences": run.differences} for seed, run in zip(seeds, runs)]


NOT_THE_SETTING = ("seed", "seeds", "out", "overwrite", *SPEED_ONLY)  # what replicate regions may differ in


def replicate_groups(labels: list[str], records: list[RegionRecord]) -> dict[str, list[str]]:
    """Regions made by one request but for its seed (``localize --seeds``): {group name: their labels}."""
    groups: dict[str, list[str]] = {}
    for label, record in zip(labels, records):
        made = record.meta.request
        if not isinstance(made, dict) or made.get("verb") != "localize":
            continue
        made = {**json.loads(json.dumps(LocalizeRequest.defaults())), **made}  # a field added since: its default
        key = json.dumps({**{k: v for k, v in made.items() if k not in NOT_THE_SETTING},
                          "finetuned_sha256": record.meta.finetuned_sha256}, sort_keys=True, default=str)
        groups.setdefault(key, []).append(label)
    out = {}
    for members in groups.values():
        seeds = [records[labels.index(m)].meta.request.get("seed") for m in members]
        if len(members) > 1 and len(set(map(str, seeds))) == len(seeds):
            out[f"{replicate_stem(members[0])} (seeds {', '.join(map(str, seeds))})"] = members
    return out


def replicate_stem(label: str) -> str:
    """The name a run's seeds share: a seed's label without its '-seed<N>' ('r-seed1' → 'r')."""
    return re.sub(r"-seed\d+( \(seed \d+\))?$", "", label)


def summarise_replicates(name: str, members: list[str], rows: list[dict], found: list[dict],
                         over: str = "seeds") -> dict:
    """The members' rows and differences as runs of one model ``name``: mean ± std across them."""
    runs = [[{**r, "model": name} for r in rows if r["model"] == m] for m in members]
    paired = [[{**d, "a": name} for d in found if d["a"] == m and d["b"] not in members] for m in members]
    rows = metrics.over_seeds(runs, ("model", "task", "distribution"))
    for row in rows if over != "seeds" else ():
        row["over"] = over
    return {"name": name, "regions": members, "rows": rows, "differences": metrics.differences_over_seeds(paired, over)}


# -- several fine-tunes ----------------------------------------------------------------------------
NOT_THE_EXPERIMENT = (*NOT_THE_SETTING, "finetuned", "finetuned_replicates")  # what differs across fine-tunes


def _role(record: RegionRecord) -> str:
    """What makes regions of different fine-tunes one experiment: the method and every setting of the request that
    made them (the mask seed included) but the fine-tuned model; a region made by no request (a core, a union)
    by its method and sources, whose size differs from one fine-tune to another."""
    made = record.meta.request if isinstance(record.meta.request, dict) else None
    if made is None:
        return json.dumps({"method": record.meta.method, "sources": record.meta.sources}, sort_keys=True, default=str)
    if made.get("verb") == LocalizeRequest.verb:  # a field added since a file was written counts as its default
        made = {**json.loads(json.dumps(LocalizeRequest.defaults(), default=str)), **made}
    setting = {k: v for k, v in made.items() if k == "seed" or k not in NOT_THE_EXPERIMENT}
    return json.dumps({"method": record.meta.method, "k": record.size, **setting}, sort_keys=True, default=str)


def _shared_name(stems: list[str]) -> str:
    """The name that several fine-tunes' files of one region share: the parts of their names (split at '-' and '_')
    alike in all ('r-ft0-seed1', 'r-ft1-seed1' → 'r-seed1'); where none are, the first name and 'fine-tunes'."""
    parts = [re.split(r"[-_]", stem) for stem in stems]
    if len({len(p) for p in parts}) == 1:
        kept = [token for token, *others in zip(*parts) if all(o == token for o in others)]
        if kept:
            return "-".join(kept)
    return f"{stems[0]} (fine-tunes)"


@dataclass
class FinetuneReplicates:
    """Regions of several fine-tunes of one base and task, the same regions on each (``finetune_replicates``)."""

    finetuned: list[str]  # each fine-tune, as its regions recorded it
    paths: list[list[str]]  # per fine-tune, its region files in the order of ``names``
    names: list[str]  # each region's name across fine-tunes

    def short_names(self) -> list[str]:
        """Each fine-tune's name in labels: its folder's name, or 'ft<i>' where two share one."""
        short = [short_ref(ft) for ft in self.finetuned]
        return short if len(set(short)) == len(short) else [f"ft{i}" for i in range(len(short))]


def finetune_replicates(req) -> FinetuneReplicates | None:
    """The regions of ``req`` by the fine-tuned model each was learned on, when they come from several and
    --finetuned does not name one for all: each fine-tune (one per fine-tune seed) is then a replicate of one
    experiment, and must hold the same regions as the others. None when the regions share one fine-tune (a rebuilt
    checkpoint under one name is evaluate's own check)."""
    if req.finetuned or len(req.regions) < 2:
        return None
    records = [load_region(p) for p in req.regions]
    by_ft: dict[str, list[int]] = {}
    for i, record in enumerate(records):
        by_ft.setdefault(record.meta.finetuned or "", []).append(i)
    if len(by_ft) < 2:
        return None
    metas = [records[members[0]].meta for members in by_ft.values()]
    for what in ("base", "task"):
        values = sorted({str(getattr(m, what)) for m in metas})
        if len(values) > 1:
            raise RegionError(f"the regions come from fine-tunes of different {what}s ({', '.join(values)}): only "
                              f"fine-tunes of one {what} are replicates; evaluate them one fine-tuned model at a time")
    ordered = []
    for members in by_ft.values():
        roles = {}
        for i in members:
            twin = roles.setdefault(_role(records[i]), i)
            if twin != i:
                raise RegionError(f"'{req.regions[twin]}' and '{req.regions[i]}' are one experiment on one fine-tuned "
                                  "model: give each fine-tune's region once")
        ordered.append(roles)
    first = ordered[0]
    for roles, meta in zip(ordered[1:], metas[1:]):
        if set(roles) != set(first):
            raise RegionError(f"the regions come from several fine-tuned models ('{metas[0].finetuned}', "
                              f"'{meta.finetuned}') but not the same regions on each (method, size, mask seed, "
                              "settings): give every fine-tune the same regions, or --finetuned to graft them all on "
                              "one")
    keys = list(first)
    paths = [[str(req.regions[roles[key]]) for key in keys] for roles in ordered]
    names: list[str] = []
    for j in range(len(keys)):
        name = _shared_name([Path(group[j]).stem for group in paths])
        names.append(name if name not in names else f"{name} ({j + 1})")
    return FinetuneReplicates([m.finetuned for m in metas], paths, names)


def _renamed(run: Result, names: dict[str, str], ft: str) -> Result:
    """One fine-tune's evaluation with its regions named as across fine-tunes, its diagrams' models by its fine-tune."""
    def name(model):
        return names.get(model, model)

    rows = [{**r, "model": name(r["model"])} for r in run.rows]
    found = [{**d, "a": name(d["a"]), "b": name(d["b"])} for d in run.differences]
    plots = {key: {f"{name(m)} · {ft}": v for m, v in getattr(run, key).items()} for key in ("reliability", "histogram")}
    odd = [{**d, "model": name(d["model"])} for d in run.disagreements]
    return replace(run, rows=rows, differences=found, disagreements=odd, **plots)


def _read_together(name: str, members: list[str], runs: list) -> dict:
    """Regions that differ only in their mask seed, read together over every fine-tune: each (fine-tune, seed) is one
    replicate of ``name`` (``summarise_replicates`` on each run's own rows, not on means over fine-tunes)."""
    tag = {(i, m): f"{m} · run {i}" for i in range(len(runs)) for m in members}
    rows = [{**r, "model": tag[(i, r["model"])]} for i, run in enumerate(runs) for r in run.rows if r["model"] in members]
    found = [{**d, "a": tag[(i, d["a"])], "b": tag.get((i, d["b"]), d["b"])}
             for i, run in enumerate(runs) for d in run.differences if d["a"] in members]
    group = summarise_replicates(name, list(tag.values()), rows, found, over="runs")
    group["regions"] = members
    return group


def evaluate_finetunes(evaluate, req, parts: FinetuneReplicates, progress=None, cancel=None, guard: Guard = LOCAL):
    """``evaluate`` run once per fine-tune: regions of several fine-tunes (one per fine-tune seed) as replicates of one
    experiment: each fine-tune is evaluated with its own regions, FT row and baselines, all on the same test examples,
    and every figure is the mean over fine-tunes with its spread: the variance the paper reports (over fine-tunes, not
    only mask seeds). With --seeds, every (fine-tune, seed) is one run of the mean."""
    start, runs, each = time.time(), [], []
    seeds = req.seeds or [None]
    short = parts.short_names()
    jobs = [(ft, name, paths, seed) for ft, name, paths in zip(parts.finetuned, short, parts.paths) for seed in seeds]
    for i, (ft, name, paths, seed) in enumerate(jobs):
        one = req.replace(regions=paths, finetuned=None, seeds=None, **({} if seed is None else {"seed": seed}))
        label = f"fine-tune {name}" + ("" if seed is None else f", seed {seed}")
        run = evaluate(one, part_progress(progress, i, len(jobs), None, label), cancel, guard)
        runs.append(_renamed(run, dict(zip(run.regions, parts.names)), name if seed is None else f"{name} s{seed}"))
        each.append({"finetuned": ft, **({} if seed is None else {"seed": seed}), "regions": paths})
    over = "runs" if req.seeds else "fine-tunes"
    rows = metrics.over_seeds([r.rows for r in runs], ("model", "task", "distribution"))
    for row in rows:
        row["over"] = over
    card.annotate(rows)
    found = metrics.differences_over_seeds([r.differences for r in runs], over)
    listed = ", ".join(f"'{name}'" for name in short)
    lines = card.evaluate_card(rows, differences=found) + [
        f"Each figure is the mean over {len(runs)} runs: {len(parts.finetuned)} fine-tunes ({listed})"
        + (f" × seeds {', '.join(map(str, req.seeds))}" if req.seeds else "") + ", each scored with its own regions, "
        "FT and baselines, all on the same test examples; the diagrams are each run's own, its numbers under "
        "per_finetune."]
    first = [load_region(p) for p in parts.paths[0]]
    together = [_read_together(name, members, runs) for name, members in replicate_groups(parts.names, first).items()]
    lines += [card.replicate_sentence(group) for group in together]
    if together or req.seeds:
        lines.append(f"A mean over runs of {len(parts.finetuned)} fine-tunes × seeds treats the runs as exchangeable: "
                     "its interval leaves out that runs of one fine-tune are alike, so with few fine-tunes it is too "
                     "narrow; the interval over fine-tunes alone (each region on its own) is the conservative one.")
    notes = list(dict.fromkeys(n for r in runs for n in r.notes))
    per_ft = [{**e, "rows": r.rows, "differences": r.differences} for e, r in zip(each, runs)]
    plots = {key: {m: v for r in runs for m, v in getattr(r, key).items()} for key in ("reliability", "histogram")}
    finish(progress)
    return replace(runs[0], request=req, notes=notes, seconds=time.time() - start, rows=rows, differences=found,
                   finetuned=None, regions={n: [g[j] for g in parts.paths] for j, n in enumerate(parts.names)},
                   card=lines, replicates=together, disagreements=[], side_by_side=None, per_finetune=per_ft,
                   finetunes=list(parts.finetuned), seeds=list(req.seeds or ()), per_seed=[], **plots)
