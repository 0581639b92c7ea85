"""Classification tasks: texts (or text pairs) with labels, the paper's setting.

A model is scored by its class probabilities: accuracy, F1 and ECE (Table 1), paired differences on the same test
examples; mask learning steps over a k-shot training sample (the paper's 64 per class by default). A classifier
head reads the classes, or a language model reads them through a prompt's label words.
"""

from __future__ import annotations

from types import SimpleNamespace

from ... import card, metrics, settings, training
from . import scoring
from ..grafts import TEST_SAMPLE_SEED
from ...config import BODY_LABEL, COMPLETION, DEFAULT_EXAMPLES_PER_CLASS, FT_LABEL, LoadOptions, is_body
from .data import OFFLINE_TASKS, DataSpec, Split, Task, batches, kshot, load_task
from ...errors import DataError, ModelError, RequestError
from ...formatting import num, pct, table
from ...paths import short_ref
from ...method import region_size
from ..base import Outcome, TaskKind, each_look, recorded_fields, register_kind


def examples_per_class(req, task: Task, notes: list[str]) -> int:
    """The k-shot size: as asked (and checked), or by default up to 256, all there are when fewer."""
    counts: dict[int, int] = {}
    for y in task.splits["train"].labels:
        counts[y] = counts.get(y, 0) + 1
    if not counts:
        raise DataError(f"task '{task.name}' has no training examples")
    fewest = min(counts.values())
    if req.examples_per_class is not None:
        if req.examples_per_class > fewest:
            short = min(counts, key=lambda c: counts[c])
            raise DataError(f"--examples-per-class {req.examples_per_class} is too large for task '{task.name}': "
                            f"class {task.label_names[short]} has only {fewest} training examples")
        return req.examples_per_class
    if fewest < DEFAULT_EXAMPLES_PER_CLASS:
        notes.append(f"task '{task.name}' has only {fewest} training examples in its smallest class: mask learning "
                     f"uses {fewest} per class (default {DEFAULT_EXAMPLES_PER_CLASS})")
        return fewest
    return DEFAULT_EXAMPLES_PER_CLASS


def kshot_batches(pair, task: Task, req, notes: list[str], seed_offset: int = 0):
    """Mask learning's data: the k-shot training sample of ``task`` and ``make_batches(epoch)`` over it."""
    config = req.learn_config()
    train = kshot(task.splits["train"], examples_per_class(req, task, notes), config.seed)

    def make_batches(epoch: int):
        return batches(pair.tokenizer, train, config.batch_size, task.max_length,
                       shuffle_seed=config.seed + seed_offset + epoch)

    return make_batches, len(train)


def _pct(v) -> str:
    return pct(v, 1, missing="")


def _num(v, digits: int = 3) -> str:
    return num(v, digits, missing="")


class Classification(TaskKind):
    name = "classification"
    words = card.ACCURACY
    task_type = Task
    columns = (("model", "model"), ("task", "task"), ("dist", "distribution"), ("n", "n"), ("accuracy", "accuracy"),
               ("F1", "f1"), ("ECE", "ece"), ("agree w/ FT", "agreement_with_ft"), ("k", "region_size"))
    markdown_columns = (("accuracy (95 % interval)", "score"), ("ECE", "ece"), ("share of FT gain", "gain_recovered"))
    verbs = ("finetune", "localize", "evaluate", "predict", "sweep", "anatomy", "compose", "export", "push",
             "reproduce", "pair", "multitask", "wise", "retrain", "continual")
    order, tried = 30, 1  # an offline task by its name; any other source is tried as a classification task first

    def claims(self, key: str, asked: str, given: set[str]) -> bool:
        return asked == self.name or key in OFFLINE_TASKS

    def spec(self, req) -> DataSpec:
        return req.data_spec()

    def takes(self, spec) -> bool:
        return isinstance(spec, DataSpec)

    def read(self, ref: str, spec, guard) -> Task:
        """Column options given for an offline task must name its own columns (text, label)."""
        spec = spec if isinstance(spec, DataSpec) else DataSpec()
        if str(ref).strip().lower() in OFFLINE_TASKS:
            for name, allowed in (("text_column", "text"), ("label_column", "label"), ("pair_column", None)):
                column = getattr(spec, name)
                if column is not None and column != allowed:
                    raise DataError(f"column '{column}' ({name}) not found in the offline task '{ref}'; "
                                    "its columns are text, label")
        return guard.checked_task(load_task(ref, spec, allow_local=guard.allow_local(tasks=[ref])))

    def made(self, meta) -> bool:
        return (getattr(meta, "loading", None) or {}).get("head") != COMPLETION

    def recorded_spec(self, meta) -> DataSpec:
        return DataSpec(**recorded_fields(meta, ("config", "text_column", "pair_column", "label_column")))

    def offline(self) -> dict[str, str]:
        return dict(OFFLINE_TASKS)

    def reading(self, options: LoadOptions, task) -> LoadOptions:
        if options.head == COMPLETION:
            raise ModelError(f"--head completion reads a causal LM on its own completions, and '{task.name}' is a "
                             "classification task: drop --head completion, or give a completion task as --task")
        return options

    def labels(self, task) -> tuple[str, ...]:
        return task.label_names

    def fits(self, pair) -> bool:
        return not pair.completion

    def misread(self, pair, task) -> str:
        return (f"'{short_ref(pair.finetuned_ref)}' was fine-tuned on completions, and '{task.name}' is a "
                "classification task: give its completion task as --task (e.g. --task dates for smollm2-dates)")

    def check_sample(self, task, req) -> None:
        examples_per_class(req, task, [])

    def mask_batches(self, pair, task, req, notes, seed_offset=0):
        scoring.check_labels(pair, task)
        return kshot_batches(pair, task, req, notes, seed_offset)

    def check_finetune(self, req, task, config, allow, notes) -> None:
        if config.lora_rank:
            raise RequestError(f"--lora-rank trains an adapter for completion tasks only: '{task.name}' is a "
                               "classification task, fine-tuned in full; drop --lora-rank, or give a completion task")

    def finetune(self, req, task, config, out, options, progress, cancel, allow) -> None:
        def step(p):
            if progress:
                progress({"stage": f"fine-tuning on {task.name}", **p.__dict__})

        training.finetune(req.base, task, config, out, progress=step, cancel=cancel, allow_local=allow,
                          request=req.as_dict(), options=options)

    def test_score(self, out, task, req, options, notes) -> dict:
        model, tokenizer, _, _ = training.load_trainable(str(out), task.label_names,
                                                         LoadOptions(head=options.head, dtype=options.dtype))
        checkpoint = SimpleNamespace(model=model.eval().to(settings.device()), tokenizer=tokenizer)
        probs, labels = scoring.predict(checkpoint, task, "test", req.test_examples)
        accuracy, n = metrics.accuracy(probs, labels), len(labels)
        if getattr(tokenizer, "prompt", None):
            notes.append(f"fine-tuned through its prompt: {tokenizer.prompt.describe()}")
        return {"test_accuracy": accuracy, "test_examples": n, "test_loss": None,
                "chance_accuracy": float(labels.bincount().max()) / n if n else None}  # always the commonest class

    def compare(self, pair, task, models, *, n, contrasts=(), oods=(), judging=None, progress=None, cancel=None):
        part = scoring.compare(pair, task, models, ood=list(oods), n=n, seed=TEST_SAMPLE_SEED,
                               contrasts=list(contrasts), progress=progress, cancel=cancel).as_dict()
        self.scored(part["rows"])
        return {**part, "generations": [], "notes": []}

    def scorer(self, pair, task, split, n, judging=None, notes=None):
        scoring.check_labels(pair, task)

        def score() -> Outcome:
            probs, labels = scoring.predict(pair, task, split, n, seed=TEST_SAMPLE_SEED)
            return Outcome(metrics.accuracy(probs, labels), len(labels), probs, labels)

        return score

    def paired(self, a: Outcome, b: Outcome, seed: int) -> dict:
        return metrics.paired_difference(a.per_example, b.per_example, a.labels, "accuracy", seed=seed)

    cheap_check = True
    scores_ood = True

    def heldout_problem(self, pair, task) -> str | None:
        if len(task.label_names) != len(pair.label_names):
            return (f"no held-out check: task '{task.name}' has {len(task.label_names)} labels, the fine-tuned model "
                    f"{len(pair.label_names)}; evaluate the region on its own task (--task)")
        return None

    def sweep_reference(self, pair, task, req, oods, cancel=None):
        scoring.check_labels(pair, task)
        seed = TEST_SAMPLE_SEED

        def score(region):
            """(metrics in distribution, {OOD task: accuracy}, test predictions) of a graft; ``None`` is the
            fine-tuned model, ``{}`` the empty region (both cached per pair)."""
            if region is None or region == {}:
                name = FT_LABEL if region is None else pair.body_name
                probs, labels = scoring.reference_predict(pair, name, task, "test", req.n, seed)
                ood = {o.name: metrics.accuracy(*scoring.reference_predict(pair, name, o, "test", req.n, seed))
                       for o in oods}
                return metrics.metrics(probs, labels), ood, probs, labels
            with pair.grafted(region):
                probs, labels = scoring.predict(pair, task, "test", req.n, seed=seed)
                ood = {o.name: metrics.accuracy(*scoring.predict(pair, o, "test", req.n, seed=seed)) for o in oods}
                return metrics.metrics(probs, labels), ood, probs, labels

        ft, ft_ood, ft_probs, labels = score(None)
        bare, _, bare_probs, _ = score({})
        return SimpleNamespace(score=score, ft=ft, ft_ood=ft_ood, ft_probs=ft_probs, labels=labels, bare=bare,
                               bare_probs=bare_probs)

    def sweep_rows(self, reference, pair, task, req, made, kept, sparsity, cancel=None):
        ft, bare = reference.ft, reference.bare
        predictions = {FT_LABEL: reference.ft_probs, pair.body_name: reference.bare_probs}
        rows = []
        for name, region in made.items():
            own, ood, predictions[name], _ = reference.score(region)
            rows.append({"method": name, "region": kept.get(name), "sparsity": sparsity,
                         "k": region_size(region), "n": own.n, "accuracy": own.accuracy,
                         "accuracy_ci": card.wilson(own.accuracy, own.n), "ece": own.ece,
                         "calibration": card.calibration(own.accuracy, own.mean_confidence), "ood": ood,
                         "ft_accuracy": ft.accuracy, "retained": own.accuracy / ft.accuracy if ft.accuracy else None,
                         "gain_recovered": card.gain_recovered(own.accuracy, ft.accuracy, bare.accuracy)})
        # each method against FT, and every two methods at this budget, on the same test examples
        methods = list(made)
        pairs = [(m, FT_LABEL, metric) for m in methods for metric in metrics.PAIRED_METRICS]
        pairs += [(a, b, metric) for x, a in enumerate(methods) for b in methods[x + 1:]
                  for metric in metrics.PAIRED_METRICS]
        found = [{**d, "sparsity": sparsity} for d in scoring.differences(predictions, reference.labels, pairs,
                                                                            task.name, seed=req.seed)]
        return rows, found

    def sweep_fields(self, reference) -> dict:
        return {"ft_accuracy": reference.ft.accuracy, "ft_ece": reference.ft.ece, "ft_ood": reference.ft_ood,
                "body_accuracy": reference.bare.accuracy, "n_test": reference.ft.n}

    def check_texts(self, req, task) -> None:
        if task.is_pair and not req.pairs:
            raise RequestError(f"task '{task.name}' reads two texts: give a second text (--pair) for each --text")
        if req.pairs and not task.is_pair:
            raise RequestError(f"--pair: task '{task.name}' reads one text; drop --pair")

    def predict(self, pair, task, req, models, ft_name, judging, notes, progress=None, cancel=None):
        """Each model's class probabilities for each sentence, and whether it decides as FT (the bare body too)."""
        sentences = Split(tuple(req.texts), (0,) * len(req.texts), tuple(req.pairs) if req.pairs else None)
        body = pair.body_name
        names = list(task.label_names)
        rows, ft_says = [], {}
        for look in each_look(models, progress, cancel, "scoring"):
            model = look.name
            with look.context():
                probs, _ = metrics.predict_proba(pair.model, batches(pair.tokenizer, sentences, 16, task.max_length))
            for i, p in enumerate(probs.tolist()):
                best = max(range(len(names)), key=p.__getitem__)
                if model == ft_name:
                    ft_says[i] = best
                rows.append({"text": i, "model": model, "probs": dict(zip(names, p)), "predicted": names[best],
                             "confidence": p[best], "agrees_with_ft": None if model in (ft_name, body) else best,
                             "probe": look.probe, "part": look.part})
        for r in rows:  # grafts against FT's own prediction on the same sentence
            if r["agrees_with_ft"] is not None:
                r["agrees_with_ft"] = r["agrees_with_ft"] == ft_says[r["text"]]
            elif r["model"] == body:
                r["agrees_with_ft"] = names.index(r["predicted"]) == ft_says[r["text"]]
        return rows, names, card.predict_card(rows, ft_name, len(req.texts))

    def answer_probs(self, pair, task, req, rows, ft_name, looks, progress=None, cancel=None):
        """The probability of the class FT picks on each sentence, and each look's own pick: one pass per look."""
        sentences = Split(tuple(req.texts), (0,) * len(req.texts), tuple(req.pairs) if req.pairs else None)
        names = list(task.label_names)
        ft = {r["text"]: names.index(r["predicted"]) for r in rows if r["model"] == ft_name}
        found = []
        for look in each_look(looks, progress, cancel, "mapping"):
            with look.context():
                probs, _ = metrics.predict_proba(pair.model, batches(pair.tokenizer, sentences, 16, task.max_length))
            found.append([(p[ft[i]], names[max(range(len(names)), key=p.__getitem__)])
                          for i, p in enumerate(probs.tolist())])
        return [{"answer": names[ft[i]], "measure": "the probability of the class the fine-tuned model picks"}
                for i in range(len(req.texts))], found

    def legend(self, rows) -> str:
        ft = next(r["model"] for r in rows) if rows else FT_LABEL
        body = next((r["model"] for r in rows if is_body(r["model"])), BODY_LABEL)
        return f"'{body}' is the graft of the empty region; agreement is with the {ft} model."

    def predict_text(self, doc) -> str:
        """Each model's predicted class, its probability, and every class's."""
        names = doc["label_names"]
        parts = []
        for i, text in enumerate(doc["texts"]):
            rows = [[r["model"], r["predicted"], pct(r["confidence"], missing="-"),
                     *(pct(r["probs"][n], missing="-") for n in names),
                     "" if r["agrees_with_ft"] is None else ("same as FT" if r["agrees_with_ft"] else "differs from FT")]
                    for r in doc["rows"] if r["text"] == i]
            shown = text if len(text) <= 100 else text[:97] + "..."
            parts += [f"{i + 1}. {shown}", table(["model", "class", "p", *names, ""], rows,
                                                 "llrr" + "r" * len(names) + "l"), ""]
        return "\n".join(parts).rstrip()

    def card(self, part, graftable, ft_name, start_overlap=None) -> list[str]:
        return card.evaluate_card(part["rows"], graftable=graftable, start_overlap=start_overlap,
                                  differences=part["differences"])


CLASSIFICATION = register_kind(Classification())

__all__ = ["CLASSIFICATION", "Classification", "examples_per_class", "kshot_batches"]
