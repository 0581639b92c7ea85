"""Prompt-based classification, the paper's main setting (§3, Table 9): a language model reads the
example inside a template, and the class score is the LM head's score of one *label word* per class.

    causal LM   "{text} It was"        score of each label word as the next token
    masked LM   "{text} It was {mask}." score of each label word at the mask

The LM head stays fixed (it is the pre-trained vocabulary projection, often tied to the input
embeddings), so fine-tuning, and hence the skill, lives in the body. Two small adapters make such
a model look like any sequence classifier to the rest of graftui:

* :class:`PromptTokenizer` is called like a Hugging Face tokenizer and returns the prompt's ids;
* :class:`PromptClassifier` wraps the LM and returns one logit per class (and the loss). Its
  parameters keep the LM's own names, so regions, anatomy and export see the LM itself.
"""

from __future__ import annotations

import json
import string
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from .config import LM_KINDS, kind_of_architecture
from .errors import ModelError

SCORINGS = ("first", "all")
DEFAULT_TEMPLATES = {"causal-lm": "{text} It was", "masked-lm": "{text} It was {mask}."}
PROMPT_FILE = "graftui_prompt.json"  # beside a checkpoint graftui fine-tuned with a prompt
_FIELDS = {"text", "text_pair", "mask"}


def kind_of(config) -> str:
    """What a checkpoint is, from its config's architectures (config.kind_of_architecture)."""
    return kind_of_architecture(getattr(config, "architectures", None))


# -- the prompt --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Prompt:
    """A template and one label word per class, in the order of the labels."""

    kind: str  # "causal-lm" | "masked-lm"
    template: str
    labels: tuple[str, ...]
    words: tuple[str, ...]
    scoring: str = "first"  # the word's first token, or all its tokens (causal LMs)
    chosen: bool = False  # the words were made from the label names, not given

    def as_dict(self) -> dict:
        return {**asdict(self), "labels": list(self.labels), "words": list(self.words)}

    @classmethod
    def from_dict(cls, data: dict) -> "Prompt":
        try:
            return cls(str(data["kind"]), str(data["template"]), tuple(map(str, data["labels"])),
                       tuple(map(str, data["words"])), str(data.get("scoring", "first")), bool(data.get("chosen", False)))
        except (KeyError, TypeError) as err:
            raise ModelError(f"unreadable prompt record ({err})") from None

    def label_words(self) -> str:
        """The ``--label-words`` text that gives this prompt back."""
        return ",".join(f"{label}={word}" for label, word in zip(self.labels, self.words))

    def describe(self) -> str:
        words = ", ".join(f"{label} → {word!r}" for label, word in zip(self.labels, self.words))
        how = "chosen from the label names" if self.chosen else "given"
        return f"{self.kind} prompt {self.template!r}; label words ({how}): {words}"


def parse_label_words(text: str) -> list[tuple[str, str]]:
    """``"negative= bad,positive= good"`` → [("negative", " bad"), ("positive", " good")]; words verbatim."""
    pairs = []
    for item in str(text).split(","):
        if not item.strip():
            continue
        label, eq, word = item.partition("=")
        if not eq or not label.strip() or not word.strip():
            raise ModelError(f"--label-words: '{item}' is not label=word (e.g. \"negative= bad,positive= good\")")
        pairs.append((label.strip(), word))
    if len(pairs) < 2:
        raise ModelError("--label-words: give one label=word pair per class, at least two")
    if len({label for label, _ in pairs}) != len(pairs):
        raise ModelError("--label-words: a label is named twice")
    return pairs


def template_fields(template: str) -> list[str]:
    try:
        return [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]
    except ValueError as err:
        raise ModelError(f"--template {template!r} is not a valid template ({err}); write fields as {{text}}") from None


def check_template(template: str, kind: str) -> None:
    """{text} once; {text_pair} at most once; {mask} exactly once for a masked LM and never for a causal one."""
    names = template_fields(template)
    unknown = sorted(set(names) - _FIELDS)
    if unknown:
        raise ModelError(f"--template: unknown field {{{unknown[0]}}}; use {{text}}, {{text_pair}} and {{mask}}")
    if names.count("text") != 1 or names.count("text_pair") > 1:
        raise ModelError("--template must hold {text} exactly once (and {text_pair} at most once)")
    if kind == "masked-lm" and names.count("mask") != 1:
        raise ModelError("--template of a masked LM must hold {mask} exactly once: the label word is scored there")
    if kind == "causal-lm" and "mask" in names:
        raise ModelError("--template of a causal LM has no {mask}: the label word is scored as the next token, "
                         "so end the template where the word would follow")


def _integers(names) -> bool:
    return tuple(names) == tuple(str(i) for i in range(len(names)))


def make_prompt(kind: str, labels: tuple[str, ...] | None, *, template: str | None = None,
                label_words: str | None = None, scoring: str = "first", recorded: dict | None = None) -> Prompt:
    """The prompt a pair is read with: what was asked, else the checkpoint's own, else defaults.

    Label words are matched to ``labels`` (the task's, in its order) by name; integer labels
    0…n−1 on either side match by position. Without label words anywhere, each label's name with
    a leading space is its word (``chosen`` says so, and results report it).
    """
    if kind not in LM_KINDS:
        raise ModelError(f"a prompt needs a causal or masked language model, not a {kind}")
    if scoring not in SCORINGS:
        raise ModelError(f"unknown label scoring '{scoring}'; choose first or all")
    if scoring == "all" and kind == "masked-lm":
        raise ModelError("--label-scoring all scores every token of a word after the prompt, which needs a causal LM; "
                         "a masked LM scores one token at the mask (use single-token label words)")
    old = Prompt.from_dict(recorded) if recorded else None
    if old is not None and old.kind != kind:
        old = None
    template = template or (old.template if old else DEFAULT_TEMPLATES[kind])
    check_template(template, kind)
    chosen = False
    if label_words:
        pairs = parse_label_words(label_words)
    elif old is not None:
        pairs, chosen = list(zip(old.labels, old.words)), old.chosen
    elif labels:
        pairs, chosen = [(name, f" {name}") for name in labels], True
    else:
        raise ModelError("this language model needs label words: give --label-words \"label= word,…\" (one per class)")
    if labels:
        given = [label for label, _ in pairs]
        if len(given) != len(labels):
            raise ModelError(f"--label-words names {len(given)} labels ({', '.join(given)}) but the task has "
                             f"{len(labels)} ({', '.join(labels)})")
        if set(given) == set(labels):
            lookup = dict(pairs)
            pairs = [(name, lookup[name]) for name in labels]
        elif _integers(labels) or _integers(given):
            pairs = [(name, word) for name, (_, word) in zip(labels, pairs)]
        else:
            raise ModelError(f"--label-words names the labels {', '.join(given)}, but the task's are "
                             f"{', '.join(labels)}; use the task's label names")
    return Prompt(kind, template, tuple(label for label, _ in pairs), tuple(word for _, word in pairs),
                  scoring, chosen)


def recorded_prompt(folder: str | Path | None) -> dict | None:
    """The prompt a checkpoint was fine-tuned with, when graftui wrote it."""
    if folder is None:
        return None
    path = Path(str(folder)) / PROMPT_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


# -- the tokenizer adapter -----------------------------------------------------------------------------
class PromptTokenizer:
    """Called like a Hugging Face tokenizer on (texts, pairs); returns each example inside the template.

    Template pieces and the example are tokenized separately and joined (as LM-BFF does), so the
    example can be truncated without cutting the template and the scoring position is exact.
    Causal prompts get the tokenizer's start token (if it uses one) and no end token: the label
    word must follow the prompt's last token.
    """

    def __init__(self, tokenizer, prompt: Prompt):
        self.tokenizer, self.prompt = tokenizer, prompt
        if prompt.kind == "masked-lm" and tokenizer.mask_token_id is None:
            raise ModelError("this tokenizer has no mask token, so it cannot fill a masked-LM template")
        self.pieces = []  # ("ids", [...]) literal text or ("field", name)
        for literal, name, _, _ in string.Formatter().parse(prompt.template):
            if name == "mask":  # the label word carries its own leading space ("It was<mask>" + " great")
                literal = literal.rstrip(" ")
            if literal:
                self.pieces.append(("ids", self._ids(literal)))
            if name == "mask":
                self.pieces.append(("ids", [tokenizer.mask_token_id]))
            elif name is not None:
                self.pieces.append(("field", name))
        self.word_ids = [self._ids(w) for w in prompt.words]
        for word, ids in zip(prompt.words, self.word_ids):
            if not ids:
                raise ModelError(f"label word {word!r} has no tokens")
        first = [ids[0] for ids in self.word_ids]
        if prompt.scoring == "first" and len(set(first)) != len(first):
            clash = [w for w, i in zip(prompt.words, first) if first.count(i) > 1]
            raise ModelError(f"label words {', '.join(map(repr, clash))} start with the same token; choose words whose "
                             "first tokens differ, or --label-scoring all")
        self.label_ids = first
        self.prefix, self.suffix = self._specials()
        if prompt.kind == "causal-lm":
            self.suffix = []

    def _ids(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _specials(self) -> tuple[list[int], list[int]]:
        """The ids the tokenizer puts before and after a text ([CLS] … [SEP], <s> …)."""
        bare = self._ids("hello")
        full = list(self.tokenizer("hello")["input_ids"])
        for i in range(len(full) - len(bare) + 1):
            if full[i:i + len(bare)] == bare:
                return full[:i], full[i + len(bare):]
        return [], []

    def __getattr__(self, name):  # everything else (pad_token_id, save_pretrained, …) is the tokenizer's
        if name in ("tokenizer", "prompt") or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.tokenizer, name)

    def _text_ids(self, text: str) -> list[int]:
        if self.prompt.kind == "masked-lm":  # a mask written in the text must not be taken for the template's
            text = text.replace(self.tokenizer.mask_token, " ")
        return self._ids(text)

    def encode_prompt(self, text: str, pair: str | None, max_length: int) -> list[int]:
        fields = {"text": self._text_ids(text), "text_pair": self._text_ids(pair or "")}
        fixed = len(self.prefix) + len(self.suffix) + sum(len(v) for k, v in self.pieces if k == "ids")
        budget = max_length - fixed
        if budget < 1:
            raise ModelError(f"the template alone takes {fixed} tokens, more than the task's maximum length {max_length}")
        used = [name for kind, name in self.pieces if kind == "field"]
        while sum(len(fields[n]) for n in used) > budget:  # cut the longer text from its end
            longest = max(used, key=lambda n: len(fields[n]))
            excess = sum(len(fields[n]) for n in used) - budget
            other = sum(len(fields[n]) for n in used if n != longest)
            cut = max(1, min(excess, len(fields[longest]) - other))  # down to the other's length, then by turns
            fields[longest] = fields[longest][:-cut]
        ids = list(self.prefix)
        for kind, value in self.pieces:
            ids += value if kind == "ids" else fields[value]
        return ids + self.suffix

    def __call__(self, texts, pairs=None, *, padding="longest", truncation=True, max_length=512,
                 return_tensors="pt", **_):
        if pairs is not None and "{text_pair}" not in self.prompt.template:
            raise ModelError("this task has two texts per example: put {text_pair} in --template (e.g. "
                             "'{text} ? {text_pair} It was')")
        rows = [self.encode_prompt(t, None if pairs is None else pairs[i], max_length) for i, t in enumerate(texts)]
        width = max(len(r) for r in rows)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        input_ids = torch.full((len(rows), width), pad, dtype=torch.long)
        attention = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):  # right padding: a causal row's last real token is where the word follows
            input_ids[i, :len(r)] = torch.tensor(r, dtype=torch.long)
            attention[i, :len(r)] = 1
        return {"input_ids": input_ids, "attention_mask": attention}

    def preview(self, text: str, pair: str | None = None, max_length: int = 128) -> dict:
        """What the model reads for one example, and each label word's tokens (the Models tab shows it)."""
        ids = self.encode_prompt(text, pair, max_length)
        decode = self.tokenizer.convert_ids_to_tokens
        return {"prompt": self.tokenizer.decode(ids), "tokens": decode(ids),
                "label_tokens": {label: decode(ids_) for label, ids_ in zip(self.prompt.labels, self.word_ids)},
                "scored": "the first token of each word" if self.prompt.scoring == "first" else "every token of each word"}


# -- the model adapter -----------------------------------------------------------------------------------
class _Output:
    """What graftui reads from a classifier's output: ``logits`` (one per class) and ``loss``."""

    def __init__(self, logits, loss):
        self.logits, self.loss = logits, loss


class LMReader(torch.nn.Module):
    """A language model inside a reader (label words, or completions): ``named_parameters`` and ``save_pretrained``
    are the LM's own, so parameter names in regions are the LM's and an export is an ordinary ``*ForCausalLM`` /
    ``*ForMaskedLM`` checkpoint; its head (outside the body) is what stays fixed."""

    def __init__(self, lm: torch.nn.Module, why: str):
        super().__init__()
        self.lm = lm
        prefix = getattr(lm, "base_model_prefix", "")
        if not prefix or not hasattr(lm, prefix):
            raise ModelError(f"{type(lm).__name__} has no separate body and head; graftui cannot {why}")
        self.prefix = prefix

    # the LM's parameters, under the LM's names
    def named_parameters(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True):
        return self.lm.named_parameters(prefix, recurse, remove_duplicate)

    @property
    def config(self):
        return self.lm.config

    @property
    def architecture(self) -> str:
        return type(self.lm).__name__

    def head_names(self) -> set[str]:
        """Parameters of the fixed LM head (outside the body); a tied head shows up as the embeddings."""
        return {n for n, _ in self.lm.named_parameters() if not n.startswith(self.prefix + ".")}

    def save_pretrained(self, folder, **kwargs) -> None:
        self.lm.save_pretrained(folder, **kwargs)


class PromptClassifier(LMReader):
    """A causal or masked LM read as a classifier through its fixed head and the label words (saved beside it)."""

    def __init__(self, lm: torch.nn.Module, tokenizer: PromptTokenizer):
        super().__init__(lm, "score label words with it")
        self.prompt = tokenizer.prompt
        self.label_ids = torch.tensor(tokenizer.label_ids, dtype=torch.long)
        self.word_ids = [torch.tensor(ids, dtype=torch.long) for ids in tokenizer.word_ids]
        self.mask_id = tokenizer.mask_token_id if self.prompt.kind == "masked-lm" else None

    def save_pretrained(self, folder, **kwargs) -> None:
        super().save_pretrained(folder, **kwargs)
        (Path(folder) / PROMPT_FILE).write_text(json.dumps(self.prompt.as_dict(), indent=2))

    def _hidden(self, input_ids, attention_mask):
        body = getattr(self.lm, self.prefix)
        out = body(input_ids=input_ids, attention_mask=attention_mask)
        return out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]

    def _vocab_scores(self, hidden: torch.Tensor, ids: torch.Tensor | None) -> torch.Tensor:
        """LM-head scores of ``hidden`` (…, d) for the token ``ids`` only (all tokens when None)."""
        if self.prompt.kind == "causal-lm":
            head = self.lm.get_output_embeddings()
            ids = None if ids is None else ids.to(head.weight.device)
            weight = head.weight if ids is None else head.weight[ids]
            scores = hidden.to(weight.device, weight.dtype) @ weight.T
            bias = getattr(head, "bias", None)
            if bias is not None:
                scores = scores + (bias if ids is None else bias[ids])
            scores = scores.float()
            config = self.lm.config  # what some causal LMs do to their logits (Cohere, Gemma 2)
            if getattr(config, "logit_scale", None):
                scores = scores * config.logit_scale
            if getattr(config, "final_logit_softcapping", None):
                scores = torch.tanh(scores / config.final_logit_softcapping) * config.final_logit_softcapping
            return scores
        heads = [m for name, m in self.lm.named_children() if name != self.prefix]
        if len(heads) != 1:
            raise ModelError(f"{type(self.lm).__name__}: cannot find its masked-LM head")
        scores = heads[0](hidden).float()
        return scores if ids is None else scores[..., ids.to(scores.device)]

    def forward(self, input_ids, attention_mask=None, labels=None, **_):
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        device = input_ids.device
        rows = torch.arange(input_ids.shape[0], device=device)
        if self.prompt.scoring == "all" and self.prompt.kind == "causal-lm":
            logits = torch.stack([self._word_logprob(input_ids, attention_mask, w.to(device)) for w in self.word_ids], -1)
        else:
            hidden = self._hidden(input_ids, attention_mask)
            if self.prompt.kind == "causal-lm":
                where = attention_mask.sum(1) - 1
            else:
                where = (input_ids == self.mask_id).int().argmax(1)
            picked = hidden[rows.to(hidden.device), where.to(hidden.device)]  # a device map may put it elsewhere
            logits = self._vocab_scores(picked, self.label_ids).to(device)
        loss = torch.nn.functional.cross_entropy(logits, labels) if labels is not None else None
        return _Output(logits, loss)

    def _word_logprob(self, input_ids, attention_mask, word):
        """log p(word | prompt): the sum over the word's tokens, each given the prompt and the tokens before it."""
        lengths = attention_mask.sum(1)
        b, n = input_ids.shape[0], word.numel()
        ids = torch.cat([input_ids, input_ids.new_zeros(b, n)], 1)
        mask = torch.cat([attention_mask, attention_mask.new_zeros(b, n)], 1)
        rows = torch.arange(b, device=ids.device)
        for j in range(n):  # the word right after each row's own prompt
            ids[rows, lengths + j] = word[j]
            mask[rows, lengths + j] = 1
        hidden = self._hidden(ids, mask)
        where = lengths[:, None] - 1 + torch.arange(n, device=ids.device)[None, :]  # positions that predict each token
        scores = self._vocab_scores(hidden[rows[:, None], where], None).log_softmax(-1)
        return scores.gather(-1, word[None, :, None].expand(b, n, 1)).squeeze(-1).sum(-1)
