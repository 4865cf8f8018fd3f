"""The embedded tiny policy: a 2-layer Llama with a character vocabulary, SFT-warm-started on addition.

`base_model_dir()` builds it once (fixed seeds, one thread: the same weights every time on one machine) into
`cache_dir()/base-model-<version>` as a standard HF directory that transformers and vLLM both load. Across CPUs the
build differs: torch picks kernels by the instruction set and the SFT is chaotic, so where it reaches its target moves
(1,150 steps with AVX-512, 2,200 capped at AVX2 on one machine: bench/base_policy_portability.py); the metadata
file records the kernels used.
The SFT stops as soon as the sampled (temperature 1) validation pass rate reaches SFT_TARGET_PASS_RATE.
At 0.8 the policy knows most sums and RL mostly sharpens what it knows, which ends inside a few minutes of CPU.
Measured by bench/base_policy.py (local loop, 16 x 4, lr 1e-4, temperature 1, 1,000 steps, 2026-11-23): mean pass
rate over steps 100-200 and 900-1000, and the fitted A:
  SFT to 0.5: 0.52 at step 0, 0.63, 0.71 (still climbing; A not identified, interval 0.28 wide)
  SFT to 0.7: 0.72, 0.81, 0.86 (still climbing; not identified, 0.15 wide)
  SFT to 0.8: 0.78, 0.87, 0.91 (bends; A 0.908 [0.895, 0.939], identified)
  SFT to 0.9: 0.91, 0.94, 0.95 (bends, but a gain of 0.04 is a few times the validation noise)
Below 0.8 RL is still teaching the sums, slowly, so a few-minute run cannot pin its asymptote down.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

from rlscale.base.settings import cache_dir
from rlscale.runner.rl.sampling import sample
from rlscale.runner.rl.tasks import Prompt, arithmetic_task

BASE_MODEL_VERSION = "v4"  # bump when the architecture, vocabulary or SFT recipe changes
SPECIAL_TOKENS = ["<pad>", "<bos>", "<eos>", "<unk>"]
CHARACTERS = [chr(code) for code in range(32, 127)] + ["\n"]  # printable ASCII and newline

ARCHITECTURE = dict(
    hidden_size=128,
    intermediate_size=512,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=2,
    head_dim=64,  # vLLM's CPU attention rejects head_dim 16; 32/64 work
    max_position_embeddings=64,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
)

SFT_SEED = 0
SFT_BATCH = 64
SFT_LR = 1e-3
SFT_MIN_STEPS = 200
SFT_MAX_STEPS = 3000
SFT_CHECK_EVERY = 25
SFT_TARGET_PASS_RATE = 0.8  # sampled at temperature 1 on SFT_EVAL_PROMPTS validation prompts
SFT_EVAL_PROMPTS = 256


def build_tokenizer():
    """A character-level PreTrainedTokenizerFast: one token per character, BOS prepended, <pad>/<eos>/<unk> specials."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {token: index for index, token in enumerate(SPECIAL_TOKENS + CHARACTERS)}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    core.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", vocab["<bos>"])]
    )
    core.add_special_tokens(SPECIAL_TOKENS)
    return PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", unk_token="<unk>",
        padding_side="left", model_max_length=ARCHITECTURE["max_position_embeddings"],
    )


def build_model(tokenizer, seed: int = SFT_SEED):
    """A freshly initialised LlamaForCausalLM (float32) sized by ARCHITECTURE."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, torch_dtype="float32", **ARCHITECTURE,
    )
    return LlamaForCausalLM(config).float()


def sft_batch(prompts: list[Prompt], tokenizer) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids [B, L], labels [B, L]) for '<bos>prompt answer<eos>', loss only on the answer and EOS."""
    rows, targets = [], []
    for prompt in prompts:
        prompt_ids = tokenizer(prompt.text)["input_ids"]
        answer_ids = tokenizer(prompt.answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        rows.append(prompt_ids + answer_ids)
        targets.append([-100] * len(prompt_ids) + answer_ids)
    width = max(len(row) for row in rows)
    input_ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    for index, (row, target) in enumerate(zip(rows, targets)):
        input_ids[index, : len(row)] = torch.tensor(row)
        labels[index, : len(target)] = torch.tensor(target)
    return input_ids, labels


def sampled_pass_rate(model, tokenizer, task, prompts: list[Prompt], *, samples: int = 1, temperature: float = 1.0,
                      max_new_tokens: int = 8, seed: int = 0) -> float:
    """Mean verifier reward over `samples` rollouts per prompt, sampled at `temperature` (ScaleRL's validation metric)."""
    generator = torch.Generator(device=model.lm_head.weight.device).manual_seed(seed)
    rollouts = sample(
        model, [tokenizer(p.text)["input_ids"] for p in prompts], n=samples, max_new_tokens=max_new_tokens,
        temperature=temperature, eos_id=tokenizer.eos_token_id, pad_id=tokenizer.pad_token_id,
        generator=generator, decode=tokenizer.decode,
    )
    rewards = [task.verify(prompts[i // samples], text) for i, text in enumerate(rollouts.completions)]
    return sum(rewards) / len(rewards)


def warm_start(model, tokenizer, *, log=None) -> tuple[int, float]:
    """SFT on 2-digit addition until the sampled validation pass rate reaches the target; returns (steps, pass rate)."""
    import random

    task = arithmetic_task(2, SFT_SEED)
    rng = random.Random(SFT_SEED)
    torch.manual_seed(SFT_SEED)
    optimizer = torch.optim.AdamW(model.parameters(), lr=SFT_LR, weight_decay=0.0)
    eval_prompts = task.validation(SFT_EVAL_PROMPTS)
    pass_rate = 0.0
    for step in range(1, SFT_MAX_STEPS + 1):
        model.train()
        input_ids, labels = sft_batch([rng.choice(task.train) for _ in range(SFT_BATCH)], tokenizer)
        loss = model(input_ids=input_ids, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step >= SFT_MIN_STEPS and step % SFT_CHECK_EVERY == 0:
            model.eval()
            pass_rate = sampled_pass_rate(model, tokenizer, task, eval_prompts, seed=SFT_SEED)
            if log:
                log(step, loss.item(), pass_rate)
            if pass_rate >= SFT_TARGET_PASS_RATE:
                return step, pass_rate
    return SFT_MAX_STEPS, pass_rate


def base_model_dir(rebuild: bool = False, *, log=None) -> Path:
    """The tiny policy's HF directory (config, safetensors, tokenizer, generation config), built on first use."""
    target = cache_dir() / f"base-model-{BASE_MODEL_VERSION}"
    if target.is_dir() and (target / "model.safetensors").is_file() and not rebuild:
        return target
    staging = Path(tempfile.mkdtemp(prefix=f".base-model-{BASE_MODEL_VERSION}-", dir=cache_dir()))
    try:
        _build_into(staging, log=log)
        if target.exists():
            trash = target.with_name(f".{target.name}-old-{os.getpid()}")
            os.replace(target, trash)
            shutil.rmtree(trash, ignore_errors=True)
        try:
            os.replace(staging, target)  # atomic: a concurrent reader sees no model or a whole one
        except OSError:
            if not (target / "model.safetensors").is_file():  # another process won the race with its own build
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _build_into(directory: Path, *, log=None) -> None:
    from transformers import GenerationConfig

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread: float reductions in a fixed order, so the build is reproducible
    try:
        tokenizer = build_tokenizer()
        model = build_model(tokenizer)
        steps, pass_rate = warm_start(model, tokenizer, log=log)
    finally:
        torch.set_num_threads(threads)
    model.eval()
    model.save_pretrained(directory, safe_serialization=True)
    tokenizer.save_pretrained(directory)
    _portable_tokenizer_class(directory / "tokenizer_config.json")
    GenerationConfig(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        do_sample=True, temperature=1.0, max_new_tokens=8,
    ).save_pretrained(directory)
    (directory / "rlscale_base_model.json").write_text(json.dumps({
        "version": BASE_MODEL_VERSION, "task": "arithmetic", "sft_steps": steps,
        "sampled_pass_rate": pass_rate, "eval_prompts": SFT_EVAL_PROMPTS, "temperature": 1.0,
        "torch": torch.__version__, "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }, indent=2) + "\n")


def _portable_tokenizer_class(path: Path) -> None:
    # transformers 5 writes its new backend name; older readers (and vLLM's) know PreTrainedTokenizerFast
    config = json.loads(path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    path.write_text(json.dumps(config, indent=2) + "\n")


def load_policy(model_dir: str | Path):
    """(model, tokenizer) from an HF directory, float32 on CPU, in train mode off."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    return model, tokenizer
