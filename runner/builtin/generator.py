"""The generator: a vLLM engine that samples n rollouts per prompt with per-token log-probs and takes weight pushes.
Weights arrive as a safetensors blob (raw tensors do not survive vLLM's RPC serializer; docs/methods.md section 8)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

KV_CACHE_BYTES = 256 * 2**20  # bounded KV cache: vLLM-CPU otherwise takes nearly all RAM
INTERRUPT_ANSWER_TOKENS = 8  # after an interrupt, the model gets this many tokens to finish its answer


class WeightSync:
    """vLLM worker extension (`worker_extension_cls`) for in-place weight loads."""

    def load_weights_blob(self, blob: bytes) -> int:
        """Load a `safetensors.torch.save(state_dict)` blob into the running model; returns the tensor count."""
        from safetensors.torch import load

        state = load(blob)
        self.reload_weights(weights_iterator=iter(state.items()))
        return len(state)

    def set_head_precision(self, precision: str) -> str:
        """Run the LM head's matmul at `precision` (tf32 or bf16: rlscale.runner.rl.head.head_matmul, the trainer's own
        function) in place of vLLM's; returns the precision. vLLM's LogitsProcessor._apply_head is the seam."""
        from rlscale.runner.rl.head import head_matmul

        processor = self.get_model().logits_processor
        if not callable(getattr(type(processor), "_apply_head", None)):
            raise RuntimeError(f"head_precision {precision}: this vLLM's LogitsProcessor has no _apply_head to replace")

        def apply_head(lm_head, hidden_states, embedding_bias):
            return head_matmul(hidden_states, lm_head.weight, embedding_bias, precision)

        processor._apply_head = apply_head
        return precision


@dataclass
class Rollout:
    """One sampled completion: token ids, the generator's log-prob of each (the old policy), and what was forced.
    `sampled[i]` is False for forced tokens (an interrupt's end-of-thinking marker): context, but no gradient."""

    token_ids: list[int]
    logprobs: list[float]
    sampled: list[bool]
    text: str
    truncated: bool  # hit max_new_tokens without EOS (before any interrupt)


@dataclass
class Generation:
    """Rollouts for a batch of prompts ([prompt][sample]) and the weights version that produced them."""

    rollouts: list[list[Rollout]]
    weights_version: int
    started: float  # wall clock (time.time()) when generation began and ended, for busy intervals
    ended: float
    tokens: int = field(default=0)  # generated tokens, sampled and forced (compute spent)
    prompt_ids: list[list[int]] = field(default_factory=list)  # each prompt's token ids, as the engine saw them

    @property
    def truncation_rate(self) -> float:
        """Fraction of rollouts that hit max_new_tokens without EOS."""
        flat = [r.truncated for group in self.rollouts for r in group]
        return sum(flat) / len(flat) if flat else 0.0


class Generator:
    """A vLLM engine over one HF model directory; FP32 LM head on request, its matmul at `head_precision` as the
    trainer's; log-probs of the sampling distribution."""

    def __init__(
        self,
        model_dir: str | Path,
        *,
        fp32_head: bool = True,
        head_precision: str = "fp32",
        seed: int = 0,
        dtype: str = "auto",
        kv_cache_bytes: int = KV_CACHE_BYTES,
        cpu_cores: str | None = None,
        max_model_len: int | None = None,
        in_process: bool = False,
    ):
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; the explicit kv_cache_bytes below is the real bound
        if cpu_cores is not None:
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = cpu_cores  # vLLM-CPU pins its OpenMP threads to these cores
        if in_process:
            # no EngineCore/Worker processes re-importing vLLM (2 CPU cores: start 5 s, not 24 s; no IPC per batch)
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        from vllm import LLM

        self.model_dir = str(model_dir)
        self.weights_version = 0
        self.busy_seconds = 0.0  # time spent generating or loading weights (for busy fractions)
        started = time.perf_counter()
        self.llm = LLM(
            model=self.model_dir,
            dtype=dtype,
            seed=seed,
            enforce_eager=True,  # no graph compilation: start-up dominates at this scale
            kv_cache_memory_bytes=kv_cache_bytes,
            max_model_len=max_model_len,
            worker_extension_cls="rlscale.runner.builtin.generator.WeightSync",
            hf_overrides={"head_dtype": "float32"} if fp32_head else None,
            logprobs_mode="processed_logprobs",  # log-probs after temperature: the distribution actually sampled
            disable_log_stats=True,
            distributed_executor_backend="uni" if in_process else None,
        )
        self.tokenizer = self.llm.get_tokenizer()
        if fp32_head and head_precision != "fp32":  # fp32 is vLLM's own float32 head (head_dtype above)
            self.llm.collective_rpc("set_head_precision", args=(head_precision,))
        self._warm_up()
        self.start_seconds = time.perf_counter() - started

    def _warm_up(self) -> None:
        # first forward and log-prob sampling pay one-off set-up (~4 s, ~2 s on CPU): engine start, not a job's hours
        from vllm import SamplingParams

        params = SamplingParams(n=2, max_tokens=2, logprobs=0, seed=0, detokenize=False)
        self.llm.generate([{"prompt_token_ids": self.encode("0")}], params, use_tqdm=False)

    def ready(self) -> dict:
        """Engine facts once started: start-up seconds and the model directory."""
        return {"start_seconds": self.start_seconds, "model_dir": self.model_dir}

    def update_weights(self, blob: bytes, version: int) -> tuple[float, float]:
        """Load new policy weights (safetensors blob) as `version`; returns the wall-clock (start, end) of the load."""
        started, clock = time.time(), time.perf_counter()
        self.llm.collective_rpc("load_weights_blob", args=(blob,))
        self.llm.reset_prefix_cache()  # cached prompt KV was computed by the old weights
        self.weights_version = version
        self.busy_seconds += time.perf_counter() - clock
        return started, time.time()

    def load_base(self, model_dir: str | Path | None = None) -> tuple[float, float]:
        """Reload base weights from `model_dir` (default: the engine's own) as version 0, for a new job."""
        from safetensors.torch import load_file, save

        state = {}
        for path in sorted(Path(model_dir or self.model_dir).glob("*.safetensors")):
            state.update(load_file(path))
        return self.update_weights(save(state), 0)

    def generate(
        self,
        prompts: list[str],
        *,
        n: int,
        temperature: float,
        max_new_tokens: int,
        length_control: str = "truncate",
        end_of_thinking: str | None = None,
        seed: int | None = None,
        logprobs: bool = True,
    ) -> Generation:
        """Sample `n` completions per prompt (prompt i seeded seed + i*n ..); length_control "interrupt"
        forces `end_of_thinking` into truncated ones. `logprobs` False (validation) skips log-probs, same samples."""
        started, clock = time.time(), time.perf_counter()
        params = [
            _params(n, temperature, max_new_tokens, logprobs, None if seed is None else seed + i * n)
            for i in range(len(prompts))
        ]
        requests = [{"prompt_token_ids": self.encode(text)} for text in prompts]
        outputs = self.llm.generate(requests, params, use_tqdm=False)
        rollouts = self._rollouts([output.outputs for output in outputs])
        if length_control == "interrupt" and end_of_thinking:
            self._interrupt(requests, rollouts, end_of_thinking, temperature, seed, logprobs)
        self.busy_seconds += time.perf_counter() - clock
        tokens = sum(len(r.token_ids) for group in rollouts for r in group)
        return Generation(
            rollouts=rollouts,
            weights_version=self.weights_version,
            started=started,
            ended=time.time(),
            tokens=tokens,
            prompt_ids=[request["prompt_token_ids"] for request in requests],
        )

    def score(self, prompt_ids: list[int], completion_ids: list[int], temperature: float = 1.0) -> list[float]:
        """Log-probs the engine assigns to a fixed completion after a prompt (for weight-sync checks)."""
        from vllm import SamplingParams

        params = SamplingParams(max_tokens=1, temperature=temperature, prompt_logprobs=0)
        output = self.llm.generate([{"prompt_token_ids": prompt_ids + completion_ids}], params, use_tqdm=False)[0]
        positions = range(len(prompt_ids), len(prompt_ids) + len(completion_ids))
        return [output.prompt_logprobs[i][tok].logprob for i, tok in zip(positions, completion_ids)]

    def encode(self, text: str) -> list[int]:
        """Token ids of a prompt as the trainer sees them (the tokenizer's own special tokens, e.g. BOS)."""
        return self.tokenizer.encode(text)

    def stats(self) -> dict:
        """Cumulative busy seconds and the current weights version."""
        return {"busy_seconds": self.busy_seconds, "weights_version": self.weights_version}

    def _rollouts(self, groups) -> list[list[Rollout]]:
        flat = [sample for group in groups for sample in group]
        texts = iter(self.tokenizer.batch_decode([list(s.token_ids) for s in flat], skip_special_tokens=True))
        return [[self._rollout(sample, next(texts)) for sample in group] for group in groups]

    def _rollout(self, sample, text: str) -> Rollout:
        logprobs = [step[token].logprob for step, token in zip(sample.logprobs or [], sample.token_ids)]
        return Rollout(
            token_ids=list(sample.token_ids),
            logprobs=logprobs,
            sampled=[True] * len(sample.token_ids),
            text=text,
            truncated=sample.finish_reason == "length",
        )

    def _interrupt(
        self, requests, rollouts, marker: str, temperature: float, seed: int | None, logprobs: bool = True
    ) -> None:
        marker_ids = self.tokenizer.encode(marker, add_special_tokens=False)  # mid-sequence: no BOS
        cut = [(i, j) for i, group in enumerate(rollouts) for j, r in enumerate(group) if r.truncated]
        if not cut:
            return
        params = [
            _params(1, temperature, INTERRUPT_ANSWER_TOKENS, logprobs, None if seed is None else seed + 7919 * (k + 1))
            for k in range(len(cut))
        ]
        continued = [
            {"prompt_token_ids": requests[i]["prompt_token_ids"] + rollouts[i][j].token_ids + marker_ids}
            for i, j in cut
        ]
        answers = self._rollouts([output.outputs for output in self.llm.generate(continued, params, use_tqdm=False)])
        for (i, j), (answer,) in zip(cut, answers):
            head = rollouts[i][j]
            rollouts[i][j] = Rollout(
                token_ids=head.token_ids + marker_ids + answer.token_ids,
                logprobs=head.logprobs + [0.0] * len(marker_ids) + answer.logprobs,
                sampled=head.sampled + [False] * len(marker_ids) + answer.sampled,
                text=head.text + marker + answer.text,
                truncated=True,
            )


def _params(n: int, temperature: float, max_tokens: int, logprobs: bool, seed: int | None):
    from vllm import SamplingParams

    # detokenize=False: the rollouts are decoded in one batch (_rollouts); vLLM would also decode every log-prob's token
    return SamplingParams(
        n=n,
        temperature=temperature,
        max_tokens=max_tokens,
        logprobs=0 if logprobs else None,
        seed=seed,
        detokenize=False,
    )


def create_generator(recipe, model_dir: str | Path | None = None):
    """A generator actor for `recipe` per `placement(recipe)`: recipe.gpu_dtype on GPUs (the FP32 head's logits stay
    float32), float32 on CPUs. Needs Ray; it can serve consecutive jobs on the same model."""
    from rlscale.runner.builtin.accounting import placement
    from rlscale.runner.builtin.local import resolve_model_dir

    where = placement(recipe)
    return generator_actor(
        model_dir or resolve_model_dir(recipe),
        devices=recipe.generator_devices,
        on_gpu=where.on_gpu,
        fp32_head=recipe.fp32_head,
        head_precision=recipe.head_precision,
        seed=recipe.seed,
        dtype=recipe.gpu_dtype if where.on_gpu else "float32",
        cpu_cores=where.generator_cores,
        in_process=not where.on_gpu,
    )


def generator_actor(model_dir: str | Path, *, devices: int = 1, on_gpu: bool = False, **engine_kwargs):
    """Start a `Generator` as a Ray actor holding `devices` GPUs (`on_gpu`) or CPU cores; returns the handle."""
    import ray

    resources = {"num_gpus": devices, "num_cpus": 1} if on_gpu else {"num_cpus": devices}
    # the engine's processes must see the same KV-cache bound; on CPU, one OpenMP thread per core held
    env = {"VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    if not on_gpu:
        env["OMP_NUM_THREADS"] = str(devices)
    actor_cls = ray.remote(**resources, runtime_env={"env_vars": env})(Generator)
    return actor_cls.remote(model_dir, **engine_kwargs)
