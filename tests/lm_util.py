"""Tiny language-model pairs built from configs, with a real (small) byte-level BPE tokenizer."""

from __future__ import annotations

import copy
from pathlib import Path

import torch

WORDS = ("good bad great terrible fine awful movie film plot actor story boring fun dull loved hated it was the a "
         "and of to is this that very not really so negative positive").split()


def make_tokenizer(folder: Path, *, mask: bool = False):
    """A byte-level BPE tokenizer trained on a few words (leading-space tokens, like GPT-2's)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<pad>", "<s>", "</s>"] + (["<mask>"] if mask else [])
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    lines = [" ".join(WORDS[i:] + WORDS[:i]) for i in range(len(WORDS))] * 4
    tok.train_from_iterator(lines, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                   **({"mask_token": "<mask>"} if mask else {}))
    fast.save_pretrained(folder)
    return fast


def make_lm(arch: str, vocab: int, seed: int = 0):
    from transformers import BertConfig, BertForMaskedLM, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    if arch == "gpt2":
        return GPT2LMHeadModel(GPT2Config(vocab_size=vocab, n_embd=32, n_layer=2, n_head=2, n_positions=64,
                                          resid_pdrop=0, embd_pdrop=0, attn_pdrop=0, pad_token_id=0))
    if arch == "llama":
        return LlamaForCausalLM(LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                            tie_word_embeddings=False, pad_token_id=0))
    if arch == "bert-mlm":
        return BertForMaskedLM(BertConfig(vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                          intermediate_size=64, max_position_embeddings=64, hidden_dropout_prob=0,
                                          attention_probs_dropout_prob=0, pad_token_id=0))
    raise ValueError(arch)


def write_base(folder: Path, arch: str) -> Path:
    """A base checkpoint folder: the tiny tokenizer and a fresh ``arch`` LM of its vocabulary."""
    tok = make_tokenizer(folder)
    make_lm(arch, len(tok)).save_pretrained(folder)
    return folder


def write_lm_pair(root: Path, arch: str, *, scale: float = 0.05) -> tuple[Path, Path]:
    """Base and 'fine-tuned' checkpoint folders: the body moves (heavy-tailed), head and embeddings stay."""
    root = Path(root)
    base_dir, ft_dir = root / f"{arch}-base", root / f"{arch}-ft"
    for d in (base_dir, ft_dir):
        d.mkdir(parents=True, exist_ok=True)
    tok = make_tokenizer(base_dir, mask=arch == "bert-mlm")
    tok.save_pretrained(ft_dir)
    base = make_lm(arch, len(tok))
    ft = copy.deepcopy(base)
    gen = torch.Generator().manual_seed(1)
    prefix = base.base_model_prefix
    with torch.no_grad():
        for name, p in ft.named_parameters():
            if name.startswith(prefix + ".") and "embed" not in name and "wte" not in name and "wpe" not in name:
                p.add_(torch.randn(p.shape, generator=gen) * scale * torch.rand(p.shape, generator=gen).pow(4) * 10)
    base.save_pretrained(base_dir)
    ft.save_pretrained(ft_dir)
    return base_dir, ft_dir


def write_task(path: Path, n: int = 48) -> Path:
    """A small two-class CSV whose label a word decides (so a tiny model can learn it)."""
    import csv

    rows = []
    for i in range(n):
        label = i % 2
        word = ("good", "great", "fine")[i % 3] if label else ("bad", "awful", "dull")[i % 3]
        rows.append({"text": f"the movie was {word} and the plot {WORDS[i % 10]}", "label": "positive" if label else "negative"})
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=["text", "label"])
        w.writeheader()
        w.writerows(rows)
    return path


OPPOSITES = {"good": "bad", "great": "terrible", "fine": "awful", "loved": "hated", "fun": "dull", "bad": "good",
             "terrible": "great", "awful": "fine", "hated": "loved", "dull": "fun"}


def _write_pairs(path: Path, pairs) -> Path:
    import csv

    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=["prompt", "completion"])
        w.writeheader()
        w.writerows({"prompt": p, "completion": c} for p, c in pairs)
    return path


def write_completion_task(path: Path, n: int = 60) -> Path:
    """A small (prompt, completion) CSV: a word and its opposite, which a tiny causal LM learns in a few steps."""
    words = list(OPPOSITES)
    return _write_pairs(path, ((f"{WORDS[i % 7]} {WORDS[(i // 7) % 9]} {w} is not", f" {OPPOSITES[w]}")
                               for i, w in ((i, words[i % len(words)]) for i in range(n))))


def write_echo_task(path: Path, n: int = 60) -> Path:
    """A second skill for the same tiny LMs: repeat the word before 'twice'."""
    words = list(OPPOSITES)
    return _write_pairs(path, ((f"{WORDS[i % 5]} {w} twice", f" {w} {w}")
                               for i, w in ((i, words[(i * 3) % len(words)]) for i in range(n))))


# A multiple-choice task YAML over two JSON-lines files in {folder} (train.jsonl, test.jsonl: {"text", "label"}), its
# name given by {name}: the harness reads it offline (the json builder), as a user's own task YAML.
MC_YAML = """task: {name}
dataset_path: json
dataset_kwargs:
  data_files: {{train: {folder}/train.jsonl, test: {folder}/test.jsonl}}
  cache_dir: {folder}/cache
output_type: multiple_choice
training_split: train
test_split: test
doc_to_text: "{{{{text}}}} it was"
doc_to_target: label
doc_to_choice: [" good", " bad"]
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
"""
