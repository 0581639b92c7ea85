"""``graftui reproduce``: the paper's experiments on the offline default, in one report.

A run is a plan of steps, each one request of an existing flow, so every number in the report comes
with the command that makes it again. Each step is saved as it finishes (``DIR/steps/<step>.json``:
the request and its result); a second run with the same ``DIR`` reads back every step whose request
is unchanged instead of running it, so an interrupted run resumes where it stopped. ``report.json``,
``report.md`` and ``figures/`` are then assembled from the saved steps alone.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from .. import settings
from ..config import (
    ADAMW_L1, DEFAULT_FINETUNED_REFS, DEFAULT_MULTITASK_TASKS, DEFAULT_SPARSITY, DEFAULT_TASK, GENERATIVE_DEFAULTS,
    PROMPT_BASE, PROMPT_LOADING, PROMPT_SPARSITY, SMOLLM2_PLATEAU_RECIPE, SMOLLM2_RECIPE, FinetuneConfig, recipe_for,
)
from ..errors import Cancelled, RequestError
from ..formatting import minutes
from ..paths import atomic_write
from ..requests import (
    MANIFEST, ContinualRequest, EvaluateRequest, FinetuneRequest, LocalizeRequest, MultitaskRequest, ReproduceRequest,
    RetrainRequest, SweepRequest, WiseRequest, check_out_dir, command_line,
)
from ..version import __version__
from . import text
from .common import LOCAL, Guard, Progress, Result, finish
from .registry import run, verb
from .reproduction_report import build_generative_report, build_report, optimizer_key, regime, write_report


# -- the plan --------------------------------------------------------------------------------------
def _recipe_fields(recipe: FinetuneConfig) -> dict:
    """A recipe as the fields of a fine-tune request."""
    return {"optimizer": recipe.optimizer, "lr": recipe.lr, "epochs": recipe.epochs,
            "train_examples": recipe.train_examples, "batch_size": recipe.batch_size}


PROMPT_PLATEAU_FIELDS, PROMPT_SHORT_FIELDS = _recipe_fields(SMOLLM2_PLATEAU_RECIPE), _recipe_fields(SMOLLM2_RECIPE)


@dataclass(frozen=True)
class Scale:
    """What a run's size changes: the fine-tuning recipe, test examples, points per curve, which extras run."""

    name: str
    recipe: dict  # lr, epochs, train_examples of every fine-tune (empty: the default recipe)
    n: int | None  # test examples per task (None: all)
    sparsities: tuple[float, ...]  # of the sweep; the evaluated budget (DEFAULT_SPARSITY) joins it in the report
    alphas: tuple[float, ...]
    continual_tasks: tuple[str, ...]
    optimizers: tuple[tuple[str, str, float], ...]  # (label, optimizer, ℓ1) of the extra fine-tunes (Fig. 5)
    multitask_lr: float | None  # the multi-task fine-tune's own learning rate (None: the recipe's)
    seconds: dict  # step -> estimated seconds on 2 CPU cores (measured on the offline default)
    seeds: int = 1  # mask-learning seeds of the single-task steps, unless the request names another number
    prompt: dict = field(default_factory=dict)  # the prompt-based setting: base, recipe (fine-tune fields), n, steps
    multitask_tasks: tuple[str, ...] = DEFAULT_MULTITASK_TASKS


FULL = Scale("full", {}, None, (1e-5, 1e-4, 3e-4, 1e-2), tuple(round(0.1 * i, 1) for i in range(11)),
             DEFAULT_MULTITASK_TASKS, (("AdamW", "adamw", 0.0), ("AdamW + ℓ1", "adamw", ADAMW_L1)), None,
             {"finetune": 210, "sweep": 360, "localize": 40, "evaluate": 60, "wise": 240, "retrain": 420,
              "multitask": 960, "continual": 1500, "optimizer-finetune": 210, "optimizer-sweep": 240,
              "prompt-finetune": 900, "prompt-localize": 300, "prompt-evaluate": 180}, seeds=3,
             prompt={"base": PROMPT_BASE, "recipe": PROMPT_PLATEAU_FIELDS, "n": 1000})
QUICK = Scale("quick", {"lr": 0.015, "epochs": 1, "train_examples": 1000}, 300, (1e-4,), (0.0, 0.5, 1.0),
              ("movies", "amazon"), (), 0.01,  # three tasks' worth of steps at lr 0.015 diverged (measured)
              {"finetune": 30, "sweep": 40, "localize": 20, "evaluate": 25, "wise": 40, "retrain": 90,
               "multitask": 330, "continual": 250, "optimizer-finetune": 30, "optimizer-sweep": 50,
               "prompt-finetune": 175, "prompt-localize": 155, "prompt-evaluate": 35},
              prompt={"base": PROMPT_BASE, "recipe": PROMPT_SHORT_FIELDS, "n": 200, "steps": 20})
TINY = Scale("tiny", {}, 64, (1e-4,), (0.0, 1.0), ("movies", "amazon"), (("AdamW", "adamw", 0.0),), None,
             {"finetune": 5, "sweep": 15, "localize": 5, "evaluate": 5, "wise": 5, "retrain": 5, "multitask": 30,
              "continual": 30, "optimizer-finetune": 5, "optimizer-sweep": 10, "prompt-finetune": 60,
              "prompt-localize": 40, "prompt-evaluate": 10},
             prompt={"base": PROMPT_BASE, "recipe": {}, "n": 64},
             multitask_tasks=("movies", "amazon"))  # GRAFTUI_FAST: tests and demos


def scale_of(req: ReproduceRequest) -> Scale:
    scale = TINY if settings.fast() else QUICK if req.quick else FULL
    return scale if req.seeds is None else replace(scale, seeds=req.seeds)


SEEDED = ("sweep", "localize", "evaluate", "localize-frozen-head", "evaluate-frozen-head", "localize-prompt",
          "evaluate-prompt")  # their cost × seeds


@dataclass
class Step:
    name: str  # file stem in DIR/steps and key in the report
    title: str
    make: Callable[[dict], object]  # earlier steps' results -> this step's request
    cost: str  # key of Scale.seconds


def _new(cls, **fields):
    """A step's request: the verb's defaults (GRAFTUI_FAST's where that mode is on) and the fields the scale sets."""
    return cls.make(**{k: v for k, v in fields.items() if v is not None})


def plan(scale: Scale, out: Path) -> list[Step]:
    """Every step of a run, in order; a step's request may use the results of the steps before it."""
    r = scale.recipe
    ft_fields = {"lr": r.get("lr"), "epochs": r.get("epochs"), "train_examples": r.get("train_examples")}
    recipe = {"ft_lr": r.get("lr"), "epochs": r.get("epochs"), "train_examples": r.get("train_examples")}
    n, task, made = scale.n, DEFAULT_TASK, out / "regions"
    seeds = list(range(scale.seeds)) if scale.seeds > 1 else None

    def regions_of(result: dict) -> list[str]:  # a localize step's regions: one per seed
        return [e["path"] for e in result.get("seeds") or ()] or [result["path"]]

    steps = [
        Step("finetune", f"fine-tune on {task} (standard head)",
             lambda R: _new(FinetuneRequest, task=task, **ft_fields, test_examples=n), "finetune"),
        Step("sweep", "sparsity sweep: learned, top-movement and random, in and out of distribution",
             lambda R: _new(SweepRequest, finetuned=R["finetune"]["out"], task=task, sparsities=list(scale.sparsities),
                            n=n, seeds=seeds), "sweep"),
        Step("localize", "the learned region at sparsity 0.1 %",
             lambda R: _new(LocalizeRequest, finetuned=R["finetune"]["out"], task=task, sparsity=DEFAULT_SPARSITY,
                            out=str(made / f"{task}-learned.safetensors"), overwrite=True, seeds=seeds), "localize"),
        Step("evaluate", "fine-tuned, bare body, graft and baselines, with calibration",
             lambda R: _new(EvaluateRequest, regions=regions_of(R["localize"]), baselines=True, n=n), "evaluate"),
        Step("finetune-frozen-head", f"fine-tune on {task} with the head frozen at its initialisation",
             lambda R: _new(FinetuneRequest, task=task, **ft_fields, freeze_head=True, test_examples=n), "finetune"),
        Step("localize-frozen-head", "the learned region of the frozen-head model",
             lambda R: _new(LocalizeRequest, finetuned=R["finetune-frozen-head"]["out"], task=task,
                            sparsity=DEFAULT_SPARSITY, out=str(made / f"{task}-frozen-head-learned.safetensors"),
                            overwrite=True, seeds=seeds),  # a step run again replaces its own file
             "localize"),
        Step("evaluate-frozen-head", "calibration with a frozen head",
             lambda R: _new(EvaluateRequest, regions=regions_of(R["localize-frozen-head"]), n=n), "evaluate"),
        Step("wise", "WiSE-FT and WiSE-graft along α",
             lambda R: _new(WiseRequest, region=R["localize"]["path"], alphas=list(scale.alphas), n=n), "wise"),
        Step("retrain", "re-training the region from θ_pre, and BitFit",
             lambda R: _new(RetrainRequest, region=R["localize"]["path"], **recipe, n=n), "retrain"),
        Step("multitask", "multi-task model: regions, overlap, Eq. 5, union and purification",
             lambda R: _new(MultitaskRequest, tasks=list(scale.multitask_tasks),
                            **{**recipe, "ft_lr": scale.multitask_lr or recipe["ft_lr"]}, n=n,
                            out=str(made / "multitask")), "multitask"),
        Step("continual", f"continual learning of {' → '.join(scale.continual_tasks)}",
             lambda R: _new(ContinualRequest, tasks=list(scale.continual_tasks), **recipe, n=n,
                            out=str(made / "continual")), "continual"),
    ]
    p = scale.prompt
    if p:
        prompt = {"template": PROMPT_LOADING.template, "label_words": PROMPT_LOADING.label_words}
        ft_prompt = _new(FinetuneRequest, base=p["base"], task=task, **prompt, **p["recipe"], test_examples=p["n"])
        steps += [
            Step("finetune-prompt", f"prompt-based fine-tune of {p['base']} on {task} ({regime(ft_prompt.recipe())})",
                 lambda R: ft_prompt, "prompt-finetune"),
            Step("localize-prompt", f"the learned region of the prompt-based fine-tune at sparsity {PROMPT_SPARSITY:g}",
                 lambda R: _new(LocalizeRequest, base=p["base"], finetuned=R["finetune-prompt"]["out"], task=task,
                                **prompt, sparsity=PROMPT_SPARSITY, steps=p.get("steps"), check_n=0,
                                out=str(made / f"{task}-prompt-learned.safetensors"), overwrite=True, seeds=seeds),
                 "prompt-localize"),
            Step("evaluate-prompt", "prompt-based: FT, the zero-shot prompt, the graft and baselines, with calibration",
                 lambda R: _new(EvaluateRequest, regions=regions_of(R["localize-prompt"]), baselines=True, n=p["n"],
                                no_ood=True), "prompt-evaluate"),
        ]
    for label, optimizer, l1 in scale.optimizers:
        key = optimizer_key(optimizer, l1)
        steps += [
            Step(f"finetune-{key}", f"fine-tune on {task} with {label}",
                 lambda R, o=optimizer, l1=l1: _new(FinetuneRequest, task=task, optimizer=o, l1=l1,
                                                    epochs=r.get("epochs"), train_examples=r.get("train_examples"),
                                                    test_examples=n), "optimizer-finetune"),
            Step(f"sweep-{key}", f"localization after {label}",
                 lambda R, key=key: _new(SweepRequest, finetuned=R[f"finetune-{key}"]["out"], task=task,
                                         sparsities=sorted({*scale.sparsities, DEFAULT_SPARSITY}),
                                         methods=["learned", "top-movement"],
                                         no_ood=True, n=n), "optimizer-sweep"),
        ]
    return steps


# -- Fig. 5 on generative skills (--section generative) ---------------------------------------------
@dataclass(frozen=True)
class Recipe:
    """One way of fine-tuning the base on a completion skill (the default skill recipe's data and steps)."""

    label: str
    optimizer: str
    lr: float
    l1: float = 0.0

    @property
    def key(self) -> str:
        return f"{self.optimizer}-lr{self.lr:g}" + (f"-l1{self.l1:g}" if self.l1 else "")


@dataclass(frozen=True)
class Study:
    """What the generative section runs: each recipe on each skill, each fine-tune swept over budgets and methods."""

    skills: tuple[str, ...]
    recipes: tuple[Recipe, ...]
    sparsities: tuple[float, ...]
    methods: tuple[str, ...]
    n: int  # held-out items each graft is judged on
    seeds: int  # mask-learning seeds of each sweep
    seconds: dict  # step -> estimated seconds on 2 CPU cores (measured on dates)
    base: str = "smollm2"


# SGD at lr 0.003 learns dates (exact match 1.000, loss 0.002 per token); at 0.03 it diverged (loss 6.2 against
# the pre-trained model's 2.2, exact match 0)
GENERATIVE_RECIPES = (Recipe("AdamW", "adamw", 1e-4), Recipe("AdamW + ℓ1 1e-3", "adamw", 1e-4, 1e-3),
                      Recipe("SGD", "sgd", 3e-3), Recipe("AdamW + ℓ1 1e-4", "adamw", 1e-4, 1e-4))
GENERATIVE_METHODS = ("learned", "budget-true", "top-movement", "random")
GENERATIVE_SKILLS = tuple(DEFAULT_FINETUNED_REFS[key][1] for key in GENERATIVE_DEFAULTS)  # dates, numbers
GENERATIVE = {
    "full": Study(GENERATIVE_SKILLS, GENERATIVE_RECIPES, (1e-4, 1e-3, 1e-2), GENERATIVE_METHODS, 200, 3,
                  {"finetune": 150, "sweep": 1800}),
    "quick": Study(GENERATIVE_SKILLS, GENERATIVE_RECIPES, (1e-4, 1e-3, 1e-2), GENERATIVE_METHODS, 100, 1,
                   {"finetune": 150, "sweep": 600}),
    "tiny": Study(GENERATIVE_SKILLS[:1], GENERATIVE_RECIPES[:2], (1e-3,), ("budget-true", "top-movement"),
                  16, 1, {"finetune": 20, "sweep": 30}),  # GRAFTUI_FAST: tests and demos
}


def generative_plan(scale: Scale, seeds: int | None) -> tuple[Study, list[Step]]:
    """A fine-tune per skill and recipe, then its sweep: learned, budget-true, top-movement and random regions at each
    budget (over the mask seeds), judged by exact match and loss per token on the same held-out items."""
    study = GENERATIVE[scale.name]
    study = study if seeds is None else replace(study, seeds=seeds)
    many = list(range(study.seeds)) if study.seeds > 1 else None
    steps = []
    for r in study.recipes:  # recipe by recipe: a run stopped early has every skill of the first recipes
        for skill in study.skills:
            recipe = recipe_for(f"{study.base}-{skill}")
            name = f"{skill}-{r.key}"
            steps += [
                Step(f"finetune-{name}", f"fine-tune {study.base} on {skill} with {r.label} (lr {r.lr:g})",
                     lambda R, skill=skill, r=r, data=recipe: _new(
                         FinetuneRequest, base=study.base, task=skill, optimizer=r.optimizer, lr=r.lr, l1=r.l1,
                         epochs=data.epochs, train_examples=data.train_examples, test_examples=study.n),
                     "finetune"),
                Step(f"sweep-{name}", f"{skill} after {r.label}: {', '.join(study.methods)} at "
                                      f"{', '.join(f'{x:g}' for x in study.sparsities)}",
                     lambda R, skill=skill, name=name: _new(
                         SweepRequest, base=study.base, finetuned=R[f"finetune-{name}"]["out"], task=skill,
                         sparsities=list(study.sparsities), methods=list(study.methods), n=study.n, seeds=many),
                     "sweep"),
            ]
    return study, steps


def cost_of(scale: Scale, step: Step) -> float:
    """A step's estimated seconds: the seeded single-task steps run once per seed."""
    return scale.seconds[step.cost] * (scale.seeds if step.name in SEEDED else 1)


def section_plan(req: ReproduceRequest, scale: Scale, out: Path):
    """The steps of the section asked for, each step's estimated seconds, and what the report is built with."""
    if req.section == "generative":
        study, steps = generative_plan(scale, req.seeds)
        return steps, lambda step: study.seconds[step.cost] * (study.seeds if step.cost == "sweep" else 1), \
            lambda R, log, seconds: build_generative_report(scale.name, study, R, log, seconds)
    return plan(scale, out), lambda step: cost_of(scale, step), \
        lambda R, log, seconds: build_report(scale, R, log, seconds)


def expected_seconds(req: ReproduceRequest) -> float:
    """The seconds a run is expected to take on 2 CPU cores, every step of its section counted (steps a resumed run
    reuses are not subtracted: an upper bound)."""
    scale = scale_of(req)
    steps, cost, _ = section_plan(req, scale, Path(req.out) if req.out else default_out(req))
    return float(sum(cost(step) for step in steps))


# -- the flow --------------------------------------------------------------------------------------
@dataclass
class ReproduceResult(Result):
    out: str = ""
    report: dict = field(default_factory=dict)  # what report.json holds
    estimate_seconds: float = 0.0
    reused: list[str] = field(default_factory=list)


def run_name(req: ReproduceRequest) -> str:
    """What a report folder's manifest records: the scale, and the section where it is not the paper's."""
    scale = scale_of(req).name
    return scale if req.section == "paper" else f"{req.section}-{scale}"


def default_out(req: ReproduceRequest) -> Path:
    return settings.subdir("reports") / f"reproduce-{run_name(req)}"


def _saved(path: Path, request) -> dict | None:
    """The saved result of a step, if it was made by this very request and everything it wrote is still there."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("request"), dict):
        return None
    # a field added to the request since the step was saved counts as its default: that is what ran then
    saved = {**json.loads(json.dumps(type(request).defaults())), **doc["request"]}
    asked = json.loads(json.dumps(request.as_dict()))
    speed_only = {"memory", "checkpoint_every"}  # change how fast a step runs, not what it finds
    if {k: v for k, v in saved.items() if k not in speed_only} != {k: v for k, v in asked.items() if k not in speed_only}:
        return None
    result = doc.get("result") or {}
    written = [result.get(key) for key in ("path", "out", "checkpoint")]
    written += [*(result.get("regions") or {}).values(), *(result.get("checkpoints") or {}).values()]
    if any(isinstance(p, str) and p and not Path(p).exists() for p in written):
        return None
    return result


def _check_folder(out: Path, name: str) -> None:
    """A new or empty folder, or one an earlier run of the same scale wrote (then it is resumed)."""
    manifest = out / MANIFEST
    if manifest.exists():
        try:
            made = json.loads(manifest.read_text()).get("mode")
        except (OSError, ValueError, AttributeError):
            made = None
        if made != name:
            raise RequestError(f"'{out}' holds a {made or 'damaged'} reproduce run, not a {name} one; give a new "
                               "--out, or the same options as that run to resume it")
    else:
        check_out_dir(str(out))


def _clear(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()


@verb(ReproduceRequest, "every experiment on the offline default, in one report (resumes where it stopped)",
      text.reproduce)
def reproduce(req: ReproduceRequest, progress: Progress | None = None, cancel=None, guard: Guard = LOCAL) -> ReproduceResult:
    """Run (or read back) every step of the plan, then write report.json, report.md and the figures."""
    req.validate()
    start = time.time()
    scale = scale_of(req)
    out = (Path(req.out).expanduser() if req.out else default_out(req)).resolve()
    _check_folder(out, run_name(req))
    (out / "steps").mkdir(parents=True, exist_ok=True)
    atomic_write(out / MANIFEST, lambda tmp: Path(tmp).write_text(
        json.dumps({"mode": run_name(req), "graftui_version": __version__})))
    steps, cost_of_step, build = section_plan(req, scale, out)
    results: dict[str, dict] = {}
    log: list[dict] = []
    done_files = {s.name: out / "steps" / f"{s.name}.json" for s in steps}
    estimate = sum(cost_of_step(s) for s in steps)

    shown = [0.0]

    def say(text: str, fraction: float) -> None:
        shown[0] = max(shown[0], fraction)
        if progress:
            progress({"stage": text, "fraction": shown[0], "announce": True})

    say(f"reproduce ({run_name(req)}): {len(steps)} steps, about {minutes(estimate)} on 2 CPU cores "
        f"from scratch (less for steps saved in {out}); report in {out}", 0.0)
    spent = 0.0
    reused = []
    for i, step in enumerate(steps, 1):
        if cancel is not None and cancel.is_set():
            raise Cancelled("reproduce cancelled; run it again to resume")
        request = step.make(results)
        cost = cost_of_step(step)
        # a step is reused only while every step before it was: a re-run step may change what later ones read
        saved = None if req.fresh or len(reused) < i - 1 else _saved(done_files[step.name], request)
        if saved is not None:
            reused.append(step.name)
            say(f"[{i}/{len(steps)}] {step.title}: saved by an earlier run, reused", (spent + cost) / estimate)
        else:
            say(f"[{i}/{len(steps)}] {step.title} (about {minutes(cost)})", spent / estimate)
            if getattr(request, "out", None) and Path(request.out).is_relative_to(out / "regions"):
                _clear(Path(request.out))  # this step's own files from an interrupted attempt

            def inner(event: dict, i=i, step=step, cost=cost) -> None:
                if not progress:
                    return
                part = event.get("fraction")
                if part is None and event.get("steps"):
                    part = event.get("step", 0) / max(event["steps"], 1)
                shown[0] = max(shown[0], min(0.999, (spent + cost * float(part or 0)) / estimate))  # never backwards
                progress({"stage": f"[{i}/{len(steps)}] {step.title}: {event.get('stage', '')}".rstrip(": "),
                          "fraction": shown[0]})

            result: Result = run(request, progress=inner, cancel=cancel, guard=guard)
            # the JSON report (a localize result's save writes its region); a step run again replaces its own
            result.write_report(done_files[step.name], overwrite=True)
            saved = json.loads(done_files[step.name].read_text())["result"]
        results[step.name] = saved
        log.append({"step": step.name, "title": step.title, "command": command_line(request),
                    "seconds": round(saved.get("seconds") or 0, 1), "reused": step.name in reused})
        spent += cost
    report = build(results, log, time.time() - start)
    write_report(out, report)
    finish(progress)
    return ReproduceResult(req, report["notes"], time.time() - start, str(out), report, estimate, reused)
