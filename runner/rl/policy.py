"""The embedded tiny policy: a 2-layer Llama with a character vocabulary, SFT-warm-started on addition.
Its weights ship in runner/rl/base/ (checked against SHA256SUMS), so every host starts RL from the same bytes."""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from rlscale.planner.recipe import TINY
from rlscale.runner.rl.sampling import sample
from rlscale.runner.rl.tasks import Prompt, arithmetic_task

from rlscale.base.settings import cache_dir

BASE_MODEL_VERSION = "v5"  # bump when the architecture, vocabulary, SFT recipe or build numerics change
SHIPPED_DIR = Path(__file__).with_name("base")  # the weights rlscale ships (built with PORTABLE_ENV)
CHECKSUMS = "SHA256SUMS"  # sha256sum's format: one '<hex>  <file>' line per file of the model directory
# least CPU-dependent numerics (baseline kernels, reproducible MKL/oneDNN, 1 thread); read at torch import: use a child
PORTABLE_ENV = {
    "ATEN_CPU_CAPABILITY": "default",
    "MKL_CBWR": "COMPATIBLE",
    "ONEDNN_MAX_CPU_ISA": "SSE41",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}
SPECIAL_TOKENS = ["<pad>", "<bos>", "<eos>", "<unk>"]
CHARACTERS = [chr(code) for code in range(32, 127)] + ["\n"]  # printable ASCII and newline
# conversational prompts (TRL's, verl's chat data) are their messages' text after <bos>: the same ids as the plain text
CHAT_TEMPLATE = "{{ bos_token }}{% for message in messages %}{{ message['content'] }}{% endfor %}"

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
    """A character-level PreTrainedTokenizerFast: one token per character, BOS prepended, <pad>/<eos>/<unk> specials,
    and a chat template that gives a conversation's messages the ids of their plain text."""
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
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
        padding_side="left",
        model_max_length=ARCHITECTURE["max_position_embeddings"],
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_model(tokenizer, seed: int = SFT_SEED):
    """A freshly initialised LlamaForCausalLM (float32) sized by ARCHITECTURE."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype="float32",
        **ARCHITECTURE,
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


def sampled_pass_rate(
    model,
    tokenizer,
    task,
    prompts: list[Prompt],
    *,
    samples: int = 1,
    temperature: float = 1.0,
    max_new_tokens: int = 8,
    seed: int = 0,
) -> float:
    """Mean verifier reward over `samples` rollouts per prompt at `temperature` (ScaleRL's validation metric)."""
    generator = torch.Generator(device=model.lm_head.weight.device).manual_seed(seed)
    rollouts = sample(
        model,
        [tokenizer(p.text)["input_ids"] for p in prompts],
        n=samples,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        eos_id=tokenizer.eos_token_id,
        pad_id=tokenizer.pad_token_id,
        generator=generator,
        decode=tokenizer.decode,
    )
    rewards = [task.verify(prompts[i // samples], text) for i, text in enumerate(rollouts.completions)]
    return sum(rewards) / len(rewards)


def warm_start(model, tokenizer, *, log=None) -> tuple[int, float]:
    """SFT on 2-digit addition until the sampled validation pass rate reaches the target; returns (steps, pass rate)."""
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
    """The tiny policy's HF directory: the shipped one (checksum-verified), else (or on `rebuild`) one built into
    cache_dir(), calling log(step, loss, pass_rate) at each SFT check."""
    if not rebuild and (SHIPPED_DIR / "model.safetensors").is_file():
        verify_checksums(SHIPPED_DIR)
        return SHIPPED_DIR
    target = cache_dir() / f"base-model-{BASE_MODEL_VERSION}"
    if target.is_dir() and (target / "model.safetensors").is_file() and not rebuild:
        return target
    staging = Path(tempfile.mkdtemp(prefix=f".base-model-{BASE_MODEL_VERSION}-", dir=cache_dir()))
    try:
        build_portable(staging, log=log)
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


def model_path(model: str) -> str:
    """What loads `model`: this policy's directory (built on first use) for 'tiny', else `model` unchanged."""
    return str(base_model_dir()) if model == TINY else model


def same_as_shipped(directory: Path) -> bool | None:
    """Whether `directory`'s weights are the shipped ones bit for bit (None when rlscale ships none)."""
    shipped = SHIPPED_DIR / "model.safetensors"
    if not shipped.is_file():
        return None
    return _sha256(directory / "model.safetensors") == _sha256(shipped)


_VERIFIED: set[tuple] = set()  # (directory, the files' sizes and mtimes) checked by this process


def verify_checksums(directory: Path) -> None:
    """Check the files SHA256SUMS lists in `directory` (again once one changed); UserError naming the first bad one."""
    from rlscale.base.errors import UserError

    stamp = (directory, tuple((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(directory.iterdir())))
    if stamp in _VERIFIED:
        return
    sums = directory / CHECKSUMS
    for line in sums.read_text().splitlines():
        expected, name = line.split(maxsplit=1)
        path = directory / name
        actual = _sha256(path) if path.is_file() else "missing"
        if actual != expected:
            raise UserError(
                f"the base policy's {name} is damaged or was changed (sha256 {actual[:16]}, expected "
                f"{expected[:16]}); reinstall rlscale, or build one: rlscale base-model --rebuild",
                file=str(sums),
            )
    _VERIFIED.add(stamp)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


_CHILD = (
    "import json, sys; from pathlib import Path; from rlscale.runner.rl.policy import _build_into; "
    "_build_into(Path(sys.argv[1]), log=lambda *row: print(json.dumps(row), flush=True))"
)


def build_portable(directory: Path, *, log=None) -> None:
    """Build the base into `directory` in a child process with PORTABLE_ENV (minutes on one core); log(step, loss,
    pass_rate) at each SFT check. RuntimeError with the child's last line if it fails."""
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryFile("w+") as errors:
        with subprocess.Popen(
            [sys.executable, "-c", _CHILD, str(directory)],
            env={**os.environ, **PORTABLE_ENV},
            stdout=subprocess.PIPE,
            stderr=errors,
            text=True,
        ) as child:
            for line in child.stdout:
                if log:
                    log(*json.loads(line))
        if child.returncode:
            errors.seek(0)
            last = ([line for line in errors.read().splitlines() if line.strip()] or ["no output"])[-1]
            raise RuntimeError(f"the base policy's build failed (exit {child.returncode}): {last}")


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
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        do_sample=True,
        temperature=1.0,
        max_new_tokens=8,
    ).save_pretrained(directory)
    environment = {key: os.environ.get(key) for key in PORTABLE_ENV}
    (directory / "rlscale_base_model.json").write_text(
        json.dumps(
            {
                "version": BASE_MODEL_VERSION,
                "task": "arithmetic",
                "sft_steps": steps,
                "sampled_pass_rate": pass_rate,
                "eval_prompts": SFT_EVAL_PROMPTS,
                "temperature": 1.0,
                "torch": torch.__version__,
                "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
                "portable": environment == PORTABLE_ENV,
                "environment": environment,
            },
            indent=2,
        )
        + "\n"
    )
    files = sorted(p.name for p in directory.iterdir() if p.is_file() and p.name != CHECKSUMS)
    (directory / CHECKSUMS).write_text("".join(f"{_sha256(directory / name)}  {name}\n" for name in files))


def _portable_tokenizer_class(path: Path) -> None:
    # transformers 5 writes its new backend name; older readers (and vLLM's) know PreTrainedTokenizerFast
    config = json.loads(path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    path.write_text(json.dumps(config, indent=2) + "\n")


def load_policy(model_dir: str | Path):
    """(model, tokenizer) from an HF directory, float32 on CPU, in eval mode."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    return model, tokenizer
