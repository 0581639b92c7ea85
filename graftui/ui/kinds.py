"""Each task kind's words in the app: its comparison table (columns, rows, the note under it), and its Try box (label,
button, the texts a box holds, the job's title, the table of answers).

The kinds themselves (``graftui.tasks``) carry no screen text; the app asks ``app_of(kind)`` for a kind's wording,
registered here by the kind's name (a kind with none of its own is worded as the kind it derives from).
"""

from __future__ import annotations

from .. import card
from ..config import FT_LABEL, is_body
from ..errors import RequestError
from ..formatting import change_text, difference_value, num, pct, score_text
from ..tasks.harness.lmeval import PREFIX
from ..kinds import KINDS, TaskKind


def _pct(v) -> str:
    return pct(v, 1, missing="")


def _num(v, digits: int = 3) -> str:
    return num(v, digits, missing="")


VERSUS = (("top-movement", "− top movement [95 % CI]"), ("random", "− random [95 % CI]"))  # (baseline, its column)


def versus(result: dict, row: dict) -> dict:
    """A region's row: its paired difference to each baseline of its size on the same task and test examples (the
    kind's first metric compared, with its interval); empty for the fine-tuned and bare models and the baselines."""
    method_of = {r["model"]: r.get("method") for r in result.get("rows") or []}
    own = method_of.get(row["model"])
    cells = {}
    for method, column in VERSUS:
        found = None if own in (None, *(m for m, _ in VERSUS)) else next(
            (d for d in result.get("differences") or () if d["a"] == row["model"] and d["task"] == row["task"]
             and method_of.get(d["b"]) == method), None)
        cells[column] = difference_value(found) if found is not None else ""
    return cells


class KindApp:
    """How the app words one kind's results (``kind``: its registered name)."""

    kind: str = ""
    named_in_lists: bool = True  # a list of tasks names the kind beside each of its tasks (plain ones go without)
    sample_label: str = "Training examples per class"  # the mask-learning sample's field on the Localize tab
    app_columns: tuple[str, ...] = ()  # the app's comparison table: short headers, the note under it says what each is
    app_note: str = ""  # what the app's comparison columns mean
    try_words: tuple[str, str, str] = ("", "", "")  # the app's Try box: its label, its button, its table's label
    predict_columns: tuple[str, ...] = ()  # the app's Try table: its columns, or those before one per model

    def app_rows(self, result: dict) -> list[dict]:
        """A comparison's rows as the app's table shows them (``app_columns``)."""
        raise NotImplementedError

    def app_heading(self, result: dict) -> str:
        """The line above the app's comparison note: the task(s) scored."""
        return f"{self.kind.capitalize()} task: **{result['task']}**. "

    def try_texts(self, text: str) -> list[str]:
        """The texts the Try box's content is: one sentence per line, or the whole box as one prompt."""
        raise NotImplementedError

    def try_title(self, texts: list[str]) -> str:
        """The Try job's title."""
        raise NotImplementedError

    def predict_rows(self, result: dict) -> list[dict]:
        """Predict's rows as the app's Try table shows them (``predict_table_columns``)."""
        raise NotImplementedError

    def predict_table_columns(self, result: dict) -> list[str]:
        """The Try table's columns for this result."""
        return list(self.predict_columns)


class ClassificationApp(KindApp):
    kind = "classification"
    named_in_lists = False

    app_columns = ("model", "task", "dist.", "n", "accuracy ↑ [95 % CI]", "share of FT gain", "Δ vs FT",
                   *(column for _, column in VERSUS), "F1 ↑", "ECE ↓", "calibration", "agree w/ FT", "k (params)")
    app_note = ("Accuracy and agreement (with the fine-tuned model's predictions) are shares of the n test examples, "
                "with a 95 % Wilson interval; share of FT gain = (graft − bare) / (FT − bare), bare being the model "
                "with an empty region (k = 0): the pre-trained body with the fine-tuned head, or, for a language model "
                "read through label words, the pre-trained model under the same prompt (zero-shot); above 100 % the "
                "graft scores above FT itself, and where FT does not beat bare there is no gain to share (n/a); Δ is "
                "the accuracy difference to the fine-tuned model on the same task; − top movement and − random: a region's "
                "paired accuracy difference to that baseline of its size on the same examples, with its 95 % interval "
                "(an interval holding 0 does not tell the two apart); F1 of the positive class (macro if "
                "more than two); ECE is the expected calibration error over 10 equal-width confidence bins (lower is "
                "better); calibration compares mean confidence with accuracy.")
    try_words = ("Sentences (one per line)", "Classify", "Each sentence, the models side by side: the class each "
                 "picks and its probability, ≠ FT where it decides otherwise than the fine-tuned model")
    predict_columns = ("sentence",)  # then one column per model

    def app_rows(self, result) -> list[dict]:
        rows = result.get("rows") or []
        ft = {r["task"]: r["accuracy"] for r in rows if r["model"] == "fine-tuned"}
        bare = {r["task"]: r["accuracy"] for r in rows if is_body(r["model"])}
        out = []
        for r in rows:
            reference = r["model"].startswith("fine-tuned") or is_body(r["model"])
            no_gain = not reference and r["task"] in ft and r["task"] in bare and ft[r["task"]] <= bare[r["task"]]
            ci = r.get("accuracy_ci") or card.wilson(r["accuracy"], r["n"])
            size = r.get("region_size")
            out.append({
                "model": r["model"],
                "task": r["task"],
                "dist.": "ID" if r["distribution"] == "in" else "OOD",
                "n": f"{r['n']:,}",
                "accuracy ↑ [95 % CI]": _pct(r["accuracy"]) + (f" [{100 * ci[0]:.0f}–{100 * ci[1]:.0f}]" if ci else ""),
                "share of FT gain": "n/a: FT ≤ bare" if no_gain else _pct(r.get("gain_recovered")),
                "Δ vs FT": "" if r["task"] not in ft else f"{100 * (r['accuracy'] - ft[r['task']]):+.1f} pts",
                **versus(result, r),
                "F1 ↑": _num(r["f1"]),
                "ECE ↓": _num(r["ece"]),
                "calibration": r.get("calibration") or "",
                "agree w/ FT": _pct(r.get("agreement_with_ft")),
                "k (params)": "full model" if r["model"].startswith("fine-tuned") else
                ("0" if size is None else f"{size:,}"),
            })
        return out

    def app_heading(self, result) -> str:
        return (f"In-distribution task: **{result['task']}**; OOD tasks: **{', '.join(result.get('ood') or []) or 'none'}"
                "**. ")

    def try_texts(self, text) -> list[str]:
        texts = [line.strip() for line in (text or "").splitlines() if line.strip()]
        if not texts:
            raise RequestError("type one or more sentences, one per line")
        return texts

    def try_title(self, texts) -> str:
        return f"Predict {len(texts)} sentence(s)"

    @staticmethod
    def _models(result) -> list[str]:
        """The models of a prediction, the fine-tuned model first and the bare body last (as in every table)."""
        listed = list(dict.fromkeys(r["model"] for r in result.get("rows") or []))
        last = [m for m in listed if is_body(m)]
        return [m for m in listed if m == FT_LABEL] + [m for m in listed if m != FT_LABEL and m not in last] + last

    def predict_table_columns(self, result) -> list[str]:
        return [*self.predict_columns, *self._models(result)]

    def predict_rows(self, result) -> list[dict]:
        texts = result.get("texts") or []
        by_text: dict[int, dict] = {}
        for r in result.get("rows") or []:
            text = texts[r["text"]] if r["text"] < len(texts) else ""
            row = by_text.setdefault(r["text"], {"sentence": f"{r['text'] + 1}. "
                                                             f"{text if len(text) <= 80 else text[:77] + '...'}"})
            row[r["model"]] = f"{r['predicted']} {_pct(r['confidence'])}" + (" ≠ FT" if r["agrees_with_ft"] is False
                                                                              else "")
        return [by_text[i] for i in sorted(by_text)]


class CompletionApp(KindApp):
    kind = "completion"
    sample_label = "Training examples (prompts; a completion task has no classes)"

    app_columns = ("model", "task", "n", "exact match ↑ [95 % CI]", "contains ↑", "token F1 ↑", "share of FT gain",
                   "Δ vs FT", *(column for _, column in VERSUS), "loss/token ↓", "perplexity ↓", "token ECE ↓", "agree w/ FT", "k (params)")
    app_note = ("Exact match: the share of the n test prompts whose greedy generation gives the reference's answer "
                "under the answer rule (first line, or what the answer regex finds, then the filters the rule names), "
                "with a 95 % Wilson interval; contains: the share whose answer contains the reference's; token F1: "
                "the mean F1 of the two answers' whitespace-separated tokens; loss/token and perplexity of the "
                "reference completion's tokens (teacher forced); token ECE: the calibration error of the next-token "
                "prediction over those tokens; agreement: the same answer as the fine-tuned model; − top movement "
                "and − random: a region's paired exact-match difference to that baseline of its size, with its 95 % "
                "interval.")
    try_words = ("Prompt (the whole box is one prompt)", "Generate", "Each model's greedy generation for the prompt")
    predict_columns = ("prompt", "model", "generation", "same answer as FT")

    def app_rows(self, result) -> list[dict]:
        rows = result.get("rows") or []
        ft = {r["task"]: r["exact_match"] for r in rows if r["model"] == "fine-tuned"}
        out = []
        for r in rows:
            ci = r.get("accuracy_ci") or card.wilson(r["exact_match"], r["n"])
            size = r.get("region_size")
            out.append({
                "model": r["model"], "task": r["task"], "n": f"{round(r['n']):,}",
                "exact match ↑ [95 % CI]": pct(r["exact_match"], 1, missing="")
                + (f" [{100 * ci[0]:.0f}–{100 * ci[1]:.0f}]" if ci else ""),
                "contains ↑": pct(r.get("contains"), 1, missing=""), "token F1 ↑": num(r.get("token_f1"), missing=""),
                "share of FT gain": pct(r.get("gain_recovered"), 1, missing=""),
                "Δ vs FT": "" if r["task"] not in ft else f"{100 * (r['exact_match'] - ft[r['task']]):+.1f} pts",
                **versus(result, r), "loss/token ↓": num(r.get("loss"), missing=""), "perplexity ↓": num(r.get("perplexity"), missing=""),
                "token ECE ↓": num(r.get("token_ece"), missing=""),
                "agree w/ FT": pct(r.get("agreement_with_ft"), 1, missing=""),
                "k (params)": "" if size is None else f"{round(size):,}"})
        return out

    def try_texts(self, text) -> list[str]:
        prompt = (text or "").strip()
        if not prompt:
            raise RequestError("type a prompt: the whole box is one prompt for a completion region")
        return [prompt]

    def try_title(self, texts) -> str:
        return "Generate from a prompt"

    def predict_rows(self, result) -> list[dict]:
        texts = result.get("texts") or []
        out = []
        for r in result.get("rows") or []:
            text = texts[r["text"]] if r["text"] < len(texts) else ""
            agrees = r.get("agrees_with_ft")
            out.append({"prompt": text if len(text) <= 80 else text[:77] + "...", "model": r["model"],
                        "generation": r.get("generation") or "", "same answer as FT": "" if agrees is None
                        else ("yes" if agrees else "no")})
        return out


class HarnessApp(CompletionApp):
    kind = "lm-eval"

    app_columns = ("model", "task", "n", "metric", "score ↑ [95 % CI]", "harness stderr", "share of FT gain", "Δ vs FT",
                   *(column for _, column in VERSUS), "k (params)")
    app_note = ("Scores are lm-evaluation-harness's own metric of each task (its YAML's first metric under its first "
                "filter), beside its stderr; the paired differences are graftui's, on the same documents. The "
                "harness's other scores (another filter or metric) follow, not compared.")

    def app_heading(self, result) -> str:
        return f"lm-evaluation-harness task(s): **{result['task'].removeprefix(PREFIX)}**. "

    def app_rows(self, result) -> list[dict]:
        """One row per model and task for the score compared (a share in % and its change in points, any other metric
        as its number and its change as a plain difference; ↓ where lower is better), then one per other score the
        harness gave (another filter or metric of the task's YAML), not compared."""
        rows = result.get("rows") or []
        ft = {r["task"]: r["score"] for r in rows if r["model"] == "fine-tuned"}
        out = []
        for r in rows:
            share = r.get("share", True)
            ci = r.get("accuracy_ci")
            interval = "" if not ci else (f" [{100 * ci[0]:.0f}–{100 * ci[1]:.0f}]" if share else
                                          f" [{ci[0]:.3f}–{ci[1]:.3f}]")
            out.append({"model": r["model"], "task": r["task"], "n": f"{round(r['n']):,}",
                        "metric": (r.get("metric") or "") + ("" if r.get("higher_is_better", True) else " ↓"),
                        "score ↑ [95 % CI]": score_text(r["score"], share, missing="") + interval,
                        "harness stderr": score_text(r.get("stderr"), share, missing=""),
                        "share of FT gain": pct(r.get("gain_recovered"), 1, missing=""),
                        "Δ vs FT": "" if r["task"] not in ft else change_text(r["score"] - ft[r["task"]], share),
                        **versus(result, r),
                        "k (params)": "" if r.get("region_size") is None else f"{round(r['region_size']):,}"})
        for r in rows:
            for metric, value in (r.get("harness") or {}).items():
                if metric != r.get("metric"):
                    out.append({**{c: "" for c in self.app_columns}, "model": r["model"], "task": r["task"],
                                "n": f"{round(r['n']):,}", "metric": f"{metric} (not compared)",
                                "score ↑ [95 % CI]": score_text(value, (r.get("shares") or {}).get(metric, False))})
        return out


APPS: dict[str, KindApp] = {app.kind: app for app in (ClassificationApp(), CompletionApp(), HarnessApp())}


def app_of(kind: TaskKind | str) -> KindApp:
    """The app's wording of a kind (or of a kind's name): its own, else that of the nearest kind it derives from."""
    kind = KINDS[kind] if isinstance(kind, str) else kind
    for cls in type(kind).__mro__:
        if getattr(cls, "name", None) in APPS:
            return APPS[cls.name]
    raise KeyError(f"the app has no wording for the task kind '{kind.name}'")
