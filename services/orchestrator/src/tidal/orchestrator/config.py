"""Configuration of the orchestrator service (`[orchestrator]`).

pydantic only (no torch), so the CLI validates a whole run config at once. The defaults
are the embedded CPU run: string reversal, which a tiny byte-level model learns in
minutes. The section is grouped by concern; `task` (one task) and `tasks` (a weighted
mixture) are two spellings of one list, so a mixture can be layered over a file naming one
task. Keys that moved into a group (`MOVED_KEYS`) fail with an error naming their place
and the date that error goes.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, model_validator

from tidal.common.config.loading import BaseConfig
from tidal.common.config.schema import FIRST
from tidal.common.config.shared import ServiceRunConfig
from tidal.orchestrator.curriculum_config import CurriculumConfig
from tidal.orchestrator.distill_config import DistillConfig
from tidal.orchestrator.task_config import CodeTaskConfig, ReversalTaskConfig, TaskConfig

Algorithm = Literal["grpo", "dr_grpo", "rloo", "remax"]

MOVED_KEYS: dict[str, str] = {
    "algorithm": "orchestrator.advantages.algorithm",
    "normalize_advantages": "orchestrator.advantages.normalize",
    "dynamic_sampling": "orchestrator.advantages.dynamic_sampling",
    "max_sampling_rounds": "orchestrator.advantages.max_sampling_rounds",
    "overlong_buffer_tokens": "orchestrator.rewards.overlong_buffer_tokens",
    "overlong_penalty": "orchestrator.rewards.overlong_penalty",
    "length_penalty": "orchestrator.rewards.length_penalty",
    "micro_batch_tokens": "orchestrator.packing.micro_batch_tokens",
    "data_parallel_ranks": "orchestrator.packing.data_parallel_ranks",
    "overlong_samples": "orchestrator.packing.overlong_samples",
    "max_async": "orchestrator.staleness.max_async",
    "max_off_policy_steps": "orchestrator.staleness.max_off_policy_steps",
    "max_inflight_requests": "orchestrator.inflight.max_requests",
    "inflight_queue_target": "orchestrator.inflight.queue_target",
    "inflight_kv_usage_target": "orchestrator.inflight.kv_usage_target",
    "generate_timeout_s": "orchestrator.timeouts.generate_s",
    "train_timeout_s": "orchestrator.timeouts.train_s",
    "peer_wait_s": "orchestrator.timeouts.peer_wait_s",
    "verifier_timeout_s": "orchestrator.timeouts.verifier_s",
    "table_every": "orchestrator.report.table_every",
    "recent_steps": "orchestrator.report.recent_steps",
}
"""The flat keys of the first `[orchestrator]` section → their place in a group."""


class SamplingConfig(BaseConfig):
    """How inference samples completions for training (behaviour policy)."""

    temperature: float = Field(default=1.0, ge=0)
    """Softmax temperature; 1.0 samples from the policy itself (what the PG loss assumes)."""
    top_p: float = Field(default=1.0, gt=0, le=1)
    """Nucleus filtering; 1.0 disables it."""
    max_tokens: Annotated[int | None, FIRST] = Field(default=None, gt=0)
    """New tokens per completion; unset means the tasks' own bound (longest reference + 2)."""


class ChatConfig(BaseConfig):
    """How prompts are rendered: the tokenizer's chat template, or plain text."""

    template: Literal["auto", "on", "off"] = "auto"
    """"auto": the chat template of a model folder's tokenizer, plain text with the byte
    tokenizer (the default run's prompts are unchanged); "on": always the template (the
    byte tokenizer has a built-in one; a folder without one is an error at start);
    "off": plain text (`tokenizer.encode(prompt)`, BOS as the tokenizer adds it).
    With the template, a problem's chat messages (or its prompt as one user message) are
    rendered with the generation prompt, and multi-turn replies become user/tool turns."""
    system_prompt: str | None = None
    """System message put before every prompt that does not open with its own (template
    only: setting it with the template off is an error)."""
    template_kwargs: dict[str, Any] = {}
    """Extra variables for the template, e.g. `{ enable_thinking = false }` for Qwen3
    (template only: setting them with the template off is an error). Qwen3 thinks unless
    told `enable_thinking = false`; `orchestrator.reasoning` splits its thinking off."""


class ReasoningConfig(BaseConfig):
    """Reasoning models: the thinking block split off before verification (docs/agents.md)."""

    parser: Literal["auto", "none", "think"] = "auto"
    """How a completion's reasoning is found: "auto" uses the tokenizer's own markers (a
    `response_template`'s reasoning field in tokenizer_config.json, else `<think>`/`</think>`
    where the vocabulary or the chat template has them; none for the byte tokenizer);
    "think" always `<think>…</think>`; "none" treats every completion as the answer.
    Verifiers, tool-call parsing and environments see the answer only; the reasoning tokens
    stay trained. A completion that does not open with the start marker is all answer (or
    all reasoning when the template opens the block in the prompt); an unclosed block is
    all reasoning with an empty answer."""
    format_weight: float = Field(default=0.0, ge=0, le=1)
    """Weight w of a format reward: the reward advantages use is (1 - w) × verifier reward
    + w × format, where format is 1 for a closed reasoning block followed by a non-empty
    answer (every turn of an episode) and 0 otherwise. 0 disables it. Reported rewards
    and pass rates stay the verifier's."""


class ToolsConfig(BaseConfig):
    """Tool calling in the episodes of tasks that offer tools (docs/agents.md)."""

    parser: Literal["auto", "hermes", "llama3_json", "byte"] = "auto"
    """How tool calls are read from the policy's text: "auto" picks the format of the
    tokenizer's chat template (the byte tokenizer's `<call>`, Llama 3 JSON, else Hermes/Qwen
    `<tool_call>`)."""
    max_turns: int = Field(default=4, gt=0)
    """Model turns per episode at most; a call in the last one is left unanswered."""
    max_episode_tokens: int = Field(default=1024, gt=0)
    """Tokens after the prompt (model turns and tool results) at most: no further turn
    starts once an episode holds this many. Apart from it, an episode ends before a reply
    that would leave the served model's context (inference's max_seq_len) no room for
    the next turn (counted in `episode/context_full`)."""
    call_timeout_s: float = Field(default=10.0, gt=0)
    """Deadline of one tool call; a late call is answered with an error."""
    max_result_chars: int = Field(default=4096, gt=0)
    """Longer tool results are cut to this many characters."""


class EvalConfig(BaseConfig):
    """Periodic evaluation on held-out problems of every task."""

    every: int = Field(default=0, ge=0)
    """Evaluate after every `every` RL steps (and after the last); 0 disables evaluation."""
    prompts: int = Field(default=16, gt=0)
    """Held-out problems per task."""
    k: int = Field(default=4, ge=0)
    """Samples per problem for pass@k (at the training temperature); 0: greedy decoding
    only, no pass@k or sampled reward (half the evaluation's generation when k is 1)."""
    after_warmup: bool = False
    """Also evaluate after the last warm-up step: the policy RL starts from, the baseline
    a run's held-out gains are measured from (needs `every` > 0 and warmup_steps > 0)."""
    at_start: bool = False
    """Also evaluate version 0 before the first step of a fresh run (not on resume); its
    figures go on the first step's record as `eval_start/<task>/...` (with `every` = 0
    too), the baseline later evaluations compare to."""


class AdvantagesConfig(BaseConfig):
    """How rewards become advantages, and which groups a step keeps."""

    algorithm: Annotated[Algorithm, FIRST] = "grpo"
    """Advantage estimator: grpo (group mean, std-normalized unless `normalize` is false),
    dr_grpo (group mean, no std), rloo (leave-one-out mean), remax (reward of a greedy
    completion of the same prompt)."""
    normalize: bool = True
    """grpo only: divide by the group's reward std."""
    dynamic_sampling: bool = False
    """DAPO dynamic sampling: drop groups whose rewards are all equal and sample more
    prompts until the step has prompts_per_step groups (or max_sampling_rounds is hit)."""
    max_sampling_rounds: int = Field(default=4, gt=0)
    """Generation rounds one step may use to fill its batch under dynamic sampling."""


class RewardsConfig(BaseConfig):
    """Reward shaping applied to the verifier's reward before advantages."""

    overlong_buffer_tokens: int = Field(default=0, ge=0)
    """DAPO overlong reward shaping: completions within this many tokens of max_tokens get
    a linearly growing penalty, up to overlong_penalty at max_tokens; 0 disables it."""
    overlong_penalty: float = Field(default=1.0, ge=0)
    """Largest overlong penalty (subtracted from the reward)."""
    length_penalty: float = Field(default=0.0, ge=0)
    """Subtract length_penalty × completion tokens / max_tokens from the reward."""


class PackingConfig(BaseConfig):
    """How a step's samples become micro-batches for the trainer."""

    micro_batch_tokens: int = Field(default=2048, gt=0)
    """Token budget of one packed micro-batch."""
    data_parallel_ranks: int | None = Field(default=None, gt=0)
    """Trainer data-parallel ranks: micro-batches come in equal counts per rank, each
    labelled with its rank, balanced by estimated cost. Unset (the default) reads the
    trainer's degree (`trainer.world_size` / `trainer.parallel.*`) from its GetStatus at
    start-up; when set it must equal that degree, else the orchestrator fails at start."""
    overlong_samples: Literal["truncate", "drop"] = "truncate"
    """A sample longer than micro_batch_tokens: keep its first tokens (truncate) or drop it;
    both are counted."""
    share_prompts: bool = True
    """Train each group's prompt once: the completions of one prompt are packed after a
    single copy of it, each seeing the prompt and itself only, so the prompt's forward and
    backward run once per micro-batch instead of once per completion (same loss and
    gradients). Context parallelism, truncation and flash-attn do not train it: left
    unset, `tidal rl` turns it off for such a trainer; set to true, `tidal rl` refuses the
    config, and a trainer deployed apart refuses the step naming this key
    (docs/orchestrator.md)."""


class StalenessConfig(BaseConfig):
    """The async window: how far generation runs ahead of training (see staleness.py)."""

    max_async: Annotated[int, FIRST] = Field(default=1, ge=0)
    """How far generation may run ahead of training: rollouts of step n start once
    inference has loaded version n-1-max_async. 0 is synchronous (on-policy)."""
    max_off_policy_steps: int | None = Field(default=None, ge=0)
    """Drop samples whose staleness (step - 1 - oldest policy version of their tokens)
    exceeds this; unset means max_async + 1 (one version of slack for mid-generation
    reloads and late loads)."""

    @property
    def bound(self) -> int:
        """The staleness a kept sample may have: max_off_policy_steps, else max_async + 1."""
        if self.max_off_policy_steps is not None:
            return self.max_off_policy_steps
        return self.max_async + 1


class InflightConfig(BaseConfig):
    """The adaptive bound on concurrent Generate calls."""

    max_requests: int = Field(default=64, gt=0)
    """Upper bound of concurrent Generate calls; the bound adapts downwards while
    inference reports more than queue_target queued requests or a KV cache fuller than
    kv_usage_target."""
    queue_target: int = Field(default=16, ge=0)
    """Queued requests at inference above which the in-flight bound is halved."""
    kv_usage_target: float = Field(default=0.9, gt=0, le=1)
    """KV-cache usage reported by inference above which the in-flight bound is halved."""


class TimeoutsConfig(BaseConfig):
    """Deadlines of calls to peers and to verifiers, in seconds."""

    generate_s: float = Field(default=300.0, gt=0)
    """Deadline of one Generate call (all completions of one prompt)."""
    train_s: float = Field(default=600.0, gt=0)
    """Deadline of one Train call."""
    peer_wait_s: float = Field(default=300.0, gt=0)
    """How long to wait at start-up for inference and the trainer to become healthy, and
    for inference to load a policy version a step needs."""
    verifier_s: float = Field(default=5.0, gt=0)
    """A verifier call taking longer scores 0 (counted as a timeout)."""


class RecoveryConfig(BaseConfig):
    """How the orchestrator rides out a trainer or weightsync that died (and was restarted,
    e.g. by `tidal rl`'s supervision) instead of failing the run."""

    peer_loss_s: float = Field(default=300.0, gt=0)
    """How long a Train call keeps being retried while the trainer is unreachable (and how
    long generation waits for an inference replica to serve again when none does) before
    the run fails naming the peer and its address."""
    keep_sent_steps: int = Field(default=16, ge=1)
    """Train requests kept after they were answered, so that a trainer restarted from a
    checkpoint older than the orchestrator's last step gets the steps it lost re-sent
    (same step ids, same data). A trainer with its step journal (the default) loses none;
    one without it (`trainer.ckpt.journal = false`, or several trainer ranks) can lose up
    to `trainer.ckpt.interval` steps: set this to at least that then."""


class ReportConfig(BaseConfig):
    """What the orchestrator shows while it runs."""

    table_every: int = Field(default=10, ge=0)
    """Print the live metrics table every this many steps; 0 disables it."""
    recent_steps: int = Field(default=20, gt=0)
    """Steps kept in GetProgress's `recent` list."""


class WandbConfig(BaseConfig):
    """Weights & Biases logging of the per-step metrics (the metrics.jsonl numbers)."""

    enabled: bool = False
    """Log every step's metrics to W&B. Needs the `wandb` package
    (`pip install 'tidal-orchestrator[wandb]'`) and, online, a W&B login."""
    project: str = Field(default="tidal", min_length=1)
    """W&B project."""
    entity: str | None = None
    """W&B entity (user or team); default: the logged-in user's."""
    mode: Literal["online", "offline", "disabled"] = "online"
    """"offline" writes the W&B run under `<run dir>/wandb/` for a later `wandb sync`."""
    name: str | None = None
    """W&B run name; default `run.name`."""
    tags: list[str] = []
    """W&B run tags."""


class OrchestratorConfig(BaseConfig):
    moved_keys: ClassVar[dict[str, str]] = MOVED_KEYS
    moved_keys_until: ClassVar[str] = "2027-03-01"

    task: Annotated[TaskConfig, FIRST] = ReversalTaskConfig()
    """The verifiable task prompts come from (use `tasks` for a mixture)."""
    tasks: list[TaskConfig] = []
    """A weighted mixture of tasks (each with `weight`); when non-empty it replaces `task`."""
    curriculum: CurriculumConfig = CurriculumConfig()
    """Which problems and tasks to train on, from online pass rates (skip the always or
    never solved, weight tasks by learning progress)."""
    steps: Annotated[int, FIRST] = Field(default=60, ge=0)
    """RL steps after the warm start. Step ids continue after the warm-up steps."""
    warmup_steps: int = Field(default=15, ge=0)
    """Supervised warm-start steps (LOSS_KIND_SFT on reference completions), run first as
    steps 1..warmup_steps."""
    prompts_per_step: Annotated[int, FIRST] = Field(default=8, gt=0)
    """Prompts (groups) per step (also the SFT batch size in prompts)."""
    group_size: Annotated[int, FIRST] = Field(default=8, gt=0)
    """Completions per prompt; advantages are computed within each group."""
    resume: bool = False
    """Continue from `<run dir>/progress.json` (written after every step): task cursors,
    RNG state and step. Without it a run starts from the beginning."""
    exit_when_done: bool = True
    """Exit (code 0) after the last step; false keeps serving GetProgress until stopped."""
    sampling: SamplingConfig = SamplingConfig()
    """Sampling parameters of rollouts."""
    advantages: AdvantagesConfig = AdvantagesConfig()
    """Advantage estimator and dynamic sampling."""
    rewards: RewardsConfig = RewardsConfig()
    """Reward shaping (overlong and length penalties)."""
    packing: PackingConfig = PackingConfig()
    """Micro-batch packing and the trainer's data-parallel ranks."""
    staleness: StalenessConfig = StalenessConfig()
    """The async window and the off-policy bound."""
    inflight: InflightConfig = InflightConfig()
    """The adaptive bound on concurrent Generate calls."""
    timeouts: TimeoutsConfig = TimeoutsConfig()
    """Deadlines of Generate, Train, peer start-up and verifier calls."""
    recovery: RecoveryConfig = RecoveryConfig()
    """Riding out a restarted trainer or weightsync (retry window, re-sendable steps)."""
    report: ReportConfig = ReportConfig()
    """The live table and GetProgress's recent steps."""
    eval: EvalConfig = EvalConfig()
    """Held-out evaluation."""
    chat: ChatConfig = ChatConfig()
    """Chat-template rendering of prompts (template, system prompt, template kwargs)."""
    tools: ToolsConfig = ToolsConfig()
    """Tool calling in episodes (parser, turn and token budget, call deadline)."""
    reasoning: ReasoningConfig = ReasoningConfig()
    """Reasoning models: the reasoning parser and the format reward."""
    wandb: WandbConfig = WandbConfig()
    """Optional Weights & Biases logging of the per-step metrics."""
    distill: DistillConfig = DistillConfig()
    """On-policy distillation from a teacher (off by default)."""

    @model_validator(mode="after")
    def _check(self) -> OrchestratorConfig:
        if self.advantages.algorithm == "rloo" and self.group_size < 2:
            raise ValueError(
                "orchestrator.advantages.algorithm rloo needs orchestrator.group_size >= 2 "
                "(a leave-one-out baseline needs another completion)"
            )
        self._check_distill()
        for task in self.task_list:
            if isinstance(task, CodeTaskConfig) and task.sandbox.wall_s >= self.timeouts.verifier_s:
                raise ValueError(
                    f"orchestrator task {task.name or task.type}: sandbox.wall_s "
                    f"({task.sandbox.wall_s}) must be under orchestrator.timeouts.verifier_s "
                    f"({self.timeouts.verifier_s}), so the sandbox, not the verifier "
                    "deadline, ends a slow program"
                )
        return self

    def _check_distill(self) -> None:
        distill = self.distill
        if not distill.enabled:
            return
        if distill.self_distill and (distill.model_path or distill.address):
            raise ValueError(
                "orchestrator.distill.self_distill uses the policy as its own teacher: leave "
                "orchestrator.distill.model_path and orchestrator.distill.address unset"
            )
        if self.sampling.temperature != 1.0 or self.sampling.top_p != 1.0:
            raise ValueError(
                "orchestrator.distill needs orchestrator.sampling.temperature = 1 and top_p = 1:"
                " the reverse KL compares the teacher with the student's own distribution, "
                "which is what the sampled tokens' logprobs are only then"
            )
        if distill.mode == "replace" and self.advantages.dynamic_sampling:
            raise ValueError(
                'orchestrator.distill.mode = "replace" ignores rewards, so '
                "orchestrator.advantages.dynamic_sampling (which drops groups of equal reward) "
                'must be false; or use mode = "add"'
            )

    @property
    def task_list(self) -> list[TaskConfig]:
        return list(self.tasks) if self.tasks else [self.task]

    @property
    def total_steps(self) -> int:
        return self.warmup_steps + self.steps


class OrchestratorRunConfig(ServiceRunConfig):
    orchestrator: OrchestratorConfig = OrchestratorConfig()  # type: ignore[assignment]
