"""The recipe: every knob of one RL job, with ScaleRL's values as defaults; the one definition the planner, runner,
store (as JSON) and exporter share. Keys are the study-file keys (docs/methods.md section 5)."""

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Loss = Literal["cispo", "gspo", "dapo", "grpo"]
LossAgg = Literal["prompt", "token", "sample"]
AdvNorm = Literal["batch", "group", "none"]
AsyncMode = Literal["pipeline", "ppo_off_policy", "sync"]
LengthControl = Literal["interrupt", "truncate"]
TINY = "tiny"  # the embedded CPU policy's name in a recipe's `model` (and in a `trl grpo` YAML's model_name_or_path)

# r clipped to [1 - low, 1 + high]; cispo: no lower cut, top 5 (ScaleRL, TRL); gspo: the GSPO paper's sequence ratio
CLIP_DEFAULTS: dict[str, tuple[float, float]] = {
    "grpo": (0.2, 0.2),
    "dapo": (0.2, 0.28),
    "gspo": (3e-4, 4e-4),
    "cispo": (1.0, 4.0),
}


class Recipe(BaseModel):
    """One RL job's configuration. Unknown keys are errors (a typo must never run the default)."""

    # allow_inf_nan: `lr: .inf` is bad input, not a recipe
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True, allow_inf_nan=False)

    # what trains it: rlscale's own Ray job, or verl 0.9.1 / TRL 1.16.0 jobs on a Ray cluster (runner.engine.ENGINES)
    engine: Literal["builtin", "verl", "trl"] = "builtin"

    model: str = Field(TINY, description="'tiny' (the embedded CPU policy) or a HF model directory")
    task: str = Field("arithmetic", description="'arithmetic', 'arithmetic_hard' or a JSONL file of {prompt, answer}")
    verifier: str | None = Field(None, description="custom verifier as 'module:function'; None = the task's own")

    prompts_per_batch: int = Field(48, ge=1)
    rollouts: int = Field(16, ge=1)
    steps: int = Field(400, ge=1)

    loss: Loss = "cispo"
    loss_agg: LossAgg = "prompt"
    adv_norm: AdvNorm = "batch"
    clip_low: float | None = Field(None, ge=0, description="None = the loss's default (CLIP_DEFAULTS)")
    clip_high: float | None = Field(None, ge=0, description="None = the loss's default (CLIP_DEFAULTS)")
    zero_variance_filter: bool = True
    no_positive_resampling: float | None = Field(
        0.9, gt=0, le=1, description="retire prompts above this pass rate; None = off"
    )
    fp32_head: bool = True
    head_precision: Literal["fp32", "tf32", "bf16"] = Field(
        "fp32",
        description=(
            "matmul precision of the FP32 head, in the builtin trainer and generator: fp32 (IEEE), tf32 (CUDA tensor "
            "cores; CPUs compute fp32), bf16 (bf16 operands, fp32 sums and logits); docs/methods.md section 5"
        ),
    )
    kl_coef: float = Field(0.0, ge=0)
    entropy_coef: float = Field(0.0, ge=0)

    lr: float = Field(
        3e-4,
        gt=0,
        description=(
            "Adam lr at lr_reference_batch; tuned for the 0.4M-parameter tiny policy (LLM runs such as ScaleRL's "
            "8B use lrs of order 1e-6; 5e-4 and up collapse the tiny policy)"
        ),
    )
    lr_scaling: Literal["sqrt", "none"] = "sqrt"
    lr_reference_batch: int = Field(768, ge=1, description="B_p x n at which `lr` applies unscaled (ScaleRL: 48 x 16)")
    lr_warmup_steps: int = Field(
        20,
        ge=0,
        description=(
            "optimizer updates of linear lr warmup (verl: lr_warmup_steps); Adam's first updates are its largest"
        ),
    )
    grad_clip: float = Field(1.0, gt=0)
    weight_decay: float = Field(0.0, ge=0)

    async_mode: AsyncMode = Field("pipeline", alias="async")
    max_staleness: int = Field(8, ge=0, description="pipeline: trainer at most k steps ahead of the generating weights")
    ppo_minibatches: int = Field(4, ge=1, description="ppo_off_policy: minibatch updates per generated batch")
    recompute_logprobs: bool = False

    temperature: float = Field(1.0, gt=0)
    max_new_tokens: int = Field(16, ge=1)
    length_control: LengthControl = "interrupt"

    eval_every: int = Field(10, ge=1)
    eval_early_per_decade: int = Field(
        0,
        ge=0,
        le=20,
        description=(
            "extra evaluations before step eval_every, this many per decade of steps, evenly in log(step): the sigmoid "
            "is fitted in log compute, where the first steps are most of the axis (0: none)"
        ),
    )
    eval_prompts: int = Field(128, ge=1)
    eval_samples: int = Field(4, ge=1, description="k samples per held-out prompt; reward = mean pass rate")
    checkpoint_every: int = Field(50, ge=1)
    seed: int = 0

    # devices each actor holds (num_gpus on a cluster, CPU cores here)
    generator_devices: int = Field(1, ge=1)
    trainer_devices: int = Field(1, ge=1)

    # trainer memory and precision (the built-in engine)
    micro_batch_tokens: int = Field(
        8192,
        ge=1,
        description=(
            "tokens (rows x padded length) per trainer forward/backward; gradients accumulate over micro-batches, "
            "the loss is normalised over the whole batch. 8192: a 1.5B model (fp32 weights and Adam, bf16 compute) "
            "within 80 GB"
        ),
    )
    activation_checkpointing: bool = Field(
        False, description="recompute each layer's activations in backward (less memory, ~1/3 more compute)"
    )
    gpu_dtype: Literal["bfloat16", "float32"] = Field(
        "bfloat16",
        description=(
            "compute dtype on CUDA: trainer autocast (weights and Adam state stay float32, FP32 head stays "
            "float32) and vLLM weights; CPUs compute in float32"
        ),
    )

    @model_validator(mode="after")
    def _clip_order(self) -> "Recipe":
        if self.loss != "cispo" and self.clip_range[0] >= 1:
            raise ValueError(f"clip_low must be < 1 for loss {self.loss}")
        return self

    @model_validator(mode="after")
    def _head_precision_needs_fp32_head(self) -> "Recipe":
        if not self.fp32_head and self.head_precision != "fp32":
            raise ValueError(
                f"head_precision {self.head_precision} is the FP32 head's matmul precision; with fp32_head false the "
                "head runs in the model's dtype (set fp32_head: true, or leave head_precision fp32)"
            )
        return self

    @property
    def clip_range(self) -> tuple[float, float]:
        """(low, high) clip for this loss, falling back to CLIP_DEFAULTS."""
        low, high = CLIP_DEFAULTS[self.loss]
        return (low if self.clip_low is None else self.clip_low, high if self.clip_high is None else self.clip_high)

    @property
    def total_batch(self) -> int:
        """Rollouts per step, B_p x n."""
        return self.prompts_per_batch * self.rollouts

    @property
    def scaled_lr(self) -> float:
        """Learning rate after sqrt(total batch / reference batch) scaling."""
        if self.lr_scaling == "none":
            return self.lr
        return self.lr * (self.total_batch / self.lr_reference_batch) ** 0.5

    def is_eval_step(self, step: int) -> bool:
        """Whether the validation pass rate is recorded after `step` (the engines also record step 0 and the last)."""
        return step % self.eval_every == 0 or (step < self.eval_every and step in self.early_eval_steps)

    @property
    def early_eval_steps(self) -> frozenset[int]:
        """Steps below eval_every evaluated by eval_early_per_decade: round(10^(i / k)), i = 0, 1, ..."""
        k = self.eval_early_per_decade
        if k == 0:
            return frozenset()
        steps = (round(10 ** (i / k)) for i in range(int(k * math.log10(self.eval_every)) + 1))
        return frozenset(s for s in steps if s < self.eval_every)

    def to_json(self) -> dict:
        """Study-file keys (`async`, not `async_mode`), every field explicit."""
        return self.model_dump(by_alias=True)
