"""Pairs and mask learning on a CUDA GPU, checked against the same work on the CPU (skipped without one).

A lazy pair moved to a GPU moves its working model only (θ_pre and θ_ft stay mapped in host memory), so
these check what the CPU suite cannot: that every write into the working model brings its values over,
that the GPU then holds one model, and that mask learning there finds the CPU's region.
"""

from __future__ import annotations

import pytest
import torch

from graftui import learning, models
from graftui.tasks.completion.data import IGNORE
from graftui.config import LearnConfig, LoadOptions
from graftui.weights import Checkpoint, Placed
from lm_util import write_base, write_lm_pair

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU here")]

COMPLETION = LoadOptions(head="completion")
IDS = torch.tensor([[1, 7, 30, 12, 2, 44]])


def _outputs(pair, region) -> list[torch.Tensor]:
    ids = IDS.to(pair.device)
    with torch.no_grad():
        found = []
        for context in (lambda: pair.grafted(region), pair.finetuned, lambda: pair.interpolated(0.5, region)):
            with context() as m:
                found.append(m(input_ids=ids).logits.float().cpu())
        found.append(pair.model(input_ids=ids).logits.float().cpu())  # back at θ_pre
    return found


def _region(pair, seed=3):
    gen = torch.Generator().manual_seed(seed)
    return {n: torch.randperm(pair.pre[n].numel(), generator=gen)[:7].sort().values for n in pair.graftable[::2]}


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_a_lazy_pair_on_a_gpu_holds_one_model_there_and_grafts_as_on_the_cpu(tmp_path, arch):
    base_dir, ft_dir = write_lm_pair(tmp_path, arch)
    cpu = models.ModelPair.load(str(base_dir), str(ft_dir), options=COMPLETION)
    region = _region(cpu)
    expected = _outputs(cpu, region)
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated()
    gpu = models.ModelPair.load(str(base_dir), str(ft_dir), options=COMPLETION).to("cuda")
    held = torch.cuda.memory_allocated() - before
    size = sum(p.numel() * p.element_size() for p in gpu.model.parameters())
    assert gpu.lazy and isinstance(gpu.pre, Placed) and isinstance(gpu.pre.source, Checkpoint)
    assert held <= 1.05 * size  # the working model, not θ_pre and θ_ft beside it
    name = gpu.graftable[0]
    assert gpu.pre[name].is_cuda and gpu.ft.take(name, torch.tensor([0, 2])).is_cuda
    for got, want in zip(_outputs(gpu, region), expected):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    state = {n: p.detach().cpu() for n, p in gpu.model.named_parameters()}
    assert all(torch.equal(state[n], cpu.param(n).detach()) for n in state)  # θ_pre again, bit for bit


def _batches(pair):
    gen = torch.Generator().manual_seed(3)
    vocab = pair.model.lm.config.vocab_size
    ids = torch.randint(3, vocab, (6, 10), generator=gen)
    labels = ids.clone()
    labels[:, :5] = IGNORE
    return lambda epoch: [{"input_ids": ids[:3], "labels": labels[:3]}, {"input_ids": ids[3:], "labels": labels[3:]}]


@pytest.mark.parametrize("candidates", ["all", "3"])
def test_mask_learning_on_a_gpu_finds_the_cpu_region(tmp_path, candidates):
    base_dir, ft_dir = write_lm_pair(tmp_path, "llama")
    found = {}
    for device in ("cpu", "cuda"):
        pair = models.ModelPair.load(str(base_dir), str(ft_dir), options=COMPLETION).to(device)
        params = {n: pair.param(n) for n in pair.graftable}
        config = LearnConfig(steps=4, lr=0.5, candidates=candidates, memory="lean")
        region, _ = learning.learn_region(pair.model, params, pair.pre, pair.ft, 60, _batches(pair), config)
        found[device] = {(n, int(i)) for n, idx in region.items() for i in idx}
        assert all(torch.equal(pair.param(n).detach().cpu(), pair.pre[n].cpu()) for n in params)  # restored
    cpu, gpu = found["cpu"], found["cuda"]
    assert len(cpu) == len(gpu) == 60
    assert len(cpu & gpu) / len(cpu | gpu) >= 0.9, (len(cpu & gpu), len(cpu | gpu))  # rounding may swap a tie


def test_a_lora_adapter_on_a_gpu_grafts_as_peft_merges_it(tmp_path):
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaForCausalLM

    base_dir = write_base(tmp_path / "base", "llama")
    model = get_peft_model(LlamaForCausalLM.from_pretrained(base_dir),
                           LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "up_proj"],
                                      lora_dropout=0.0))
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    model.save_pretrained(tmp_path / "adapter")
    with torch.no_grad():
        merged = model.merge_and_unload().eval()(input_ids=IDS).logits
    pair = models.ModelPair.load(str(base_dir), str(tmp_path / "adapter"), options=COMPLETION).to("cuda")
    assert pair.adapter is not None and isinstance(pair.ft, Placed)
    whole = {n: (pair.ft[n] != pair.pre[n]).reshape(-1).nonzero().squeeze(1).cpu() for n in pair.graftable
             if not torch.equal(pair.ft[n], pair.pre[n])}
    with torch.no_grad(), pair.grafted(whole) as m:
        grafted = m(input_ids=IDS.cuda()).logits.cpu()
    torch.testing.assert_close(grafted, merged, rtol=1e-4, atol=1e-4)
