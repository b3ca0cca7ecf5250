"""Task configs: a discriminated union on `type`, one class per built-in task plus plug-ins.

Every config carries `weight` and `name`, so a mixture is a list of task configs. A plug-in
is an import path with free-form `options`, resolved at start so a typo fails before any
step. Held-out data comes from the same task (another seed stream, or `eval_fraction` of a
dataset unless `eval_path`/`eval_split` names other records), and dataset field names are
configuration, so GSM8K-, MATH- or chat-style files load as they are.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from tidal.common.config.loading import BaseConfig
from tidal.orchestrator.scoring.model_reward_config import RewardConfig
from tidal.orchestrator.scoring.sandbox.limits import SandboxLimits

DEFAULT_EVAL_FRACTION = 0.1


class TaskCommon(BaseConfig):
    weight: float = Field(default=1.0, gt=0)
    """Share of this task in a mixture (normalized over all tasks)."""
    name: str = ""
    """Label in metrics; empty means the task's type."""
    reward: RewardConfig | None = None
    """Score completions with an LLM judge or a reward model instead of the task's own
    verifier (`type = "judge"` or `"reward_model"`; docs/agents.md)."""


class GeneratedCommon(TaskCommon):
    train_size: int | None = Field(default=None, ge=1)
    """A finite training set: the first train_size generated problems, walked epoch by
    epoch (so the curriculum can track and skip problems one by one); unset draws a new
    problem every time. Held-out problems come from their own seed stream either way."""


class ReversalTaskConfig(GeneratedCommon):
    """The built-in verifiable task: reverse a random string ("abc>" → "cba")."""

    type: Literal["reversal"] = "reversal"
    """Task kind: reversal | arithmetic | countdown | dataset | reasoning_gym | code |
    lookup | verifiers | agent | import."""
    alphabet: str = Field(default="abcd", min_length=1)
    """Characters the strings are drawn from (ASCII, no '>')."""
    min_len: int = Field(default=1, ge=1)
    """Shortest string to reverse."""
    max_len: int = Field(default=3, ge=1)
    """Longest string to reverse."""
    turns: int = Field(default=1, ge=1, le=8)
    """Strings per episode: with turns > 1 the environment answers each reversal with
    the next string ("\nabd>"), and the reward is the mean over the turns."""
    partial_credit: bool = True
    """Reward the share of positions right (a wrong answer still earns some); false: 1 for
    the exact reversal, else 0."""

    @model_validator(mode="after")
    def _check(self) -> ReversalTaskConfig:
        if self.min_len > self.max_len:
            raise ValueError(f"min_len {self.min_len} is larger than max_len {self.max_len}")
        if ">" in self.alphabet or not self.alphabet.isascii():
            raise ValueError(f"alphabet {self.alphabet!r} must be ASCII and must not contain '>'")
        return self


class LookupTaskConfig(GeneratedCommon):
    """A tool task: report the value stored under a key, which only `lookup(key)` knows.

    The chat template must be on (`orchestrator.chat.template = "on"`)."""

    type: Literal["lookup"] = "lookup"
    """Task kind."""
    alphabet: str = Field(default="abcdefgh", min_length=2)
    """Characters keys and values are drawn from (ASCII letters)."""
    key_len: int = Field(default=2, ge=1, le=16)
    """Length of a key."""
    value_len: int = Field(default=3, ge=1, le=16)
    """Length of a value: what the answer must be."""
    keys: int = Field(default=3, ge=1, le=16)
    """Keys in each problem's table (the prompt asks for one; the others are decoys)."""
    guess_fraction: float = Field(default=0.0, ge=0, le=1)
    """Share of demonstrations (warm-up targets) that answer a random value without calling
    the tool: imperfect demonstrations, after which the policy sometimes guesses and RL
    has the choice to call to learn."""

    @model_validator(mode="after")
    def _check(self) -> LookupTaskConfig:
        if not (self.alphabet.isascii() and self.alphabet.isalpha()):
            raise ValueError(f"alphabet {self.alphabet!r} must be ASCII letters")
        return self


class ArithmeticTaskConfig(GeneratedCommon):
    """Integer arithmetic: "12+7=" → "19", scored by the numeric verifier."""

    type: Literal["arithmetic"] = "arithmetic"
    """Task kind."""
    max_operand: int = Field(default=20, ge=1)
    """Operands are drawn from 0..max_operand."""
    operators: str = Field(default="+-", pattern=r"^[+\-*]+$")
    """Operators to draw from (any of "+-*")."""


class CountdownTaskConfig(GeneratedCommon):
    """Reach a target with given numbers: "3 5 7=22>" → "3*5+7" (each number at most once)."""

    type: Literal["countdown"] = "countdown"
    """Task kind."""
    num_numbers: int = Field(default=3, ge=2, le=6)
    """How many numbers a problem offers."""
    max_number: int = Field(default=9, ge=1)
    """Numbers are drawn from 1..max_number."""


class DatasetTaskConfig(TaskCommon):
    """Prompts and answers from local records: a JSONL, JSON, parquet or Arrow file, a
    `datasets` `save_to_disk` folder, or a folder of data files (see docs/tasks.md)."""

    type: Literal["dataset"] = "dataset"
    """Task kind."""
    path: Path
    """`.jsonl` (read line by line, bad lines skipped), `.json`, `.parquet` or `.arrow`
    file, or a folder: a `save_to_disk` one, or one of data files whose names give the
    splits (`train.jsonl`, `test-*.parquet`)."""
    split: str | None = None
    """Split to train on when `path` holds several (a DatasetDict folder or a folder of
    data files); unset means the only split, or "train"."""
    eval_path: Path | None = None
    """Separate file or folder of evaluation records (replaces `eval_fraction`)."""
    eval_split: str | None = None
    """Split of `eval_path` (or of `path` when `eval_path` is unset) used for evaluation
    (replaces `eval_fraction`)."""
    prompt_field: str = "prompt"
    """Field holding the prompt text."""
    messages_field: str | None = None
    """Field holding the prompt as chat messages ([{role, content}, ...]); when set it is
    used instead of `prompt_field`."""
    answer_field: str = "answer"
    """Field holding what the verifier checks (a string or a number)."""
    reference_field: str = "reference"
    """Optional field with the warm-start target; missing means the answer."""
    metadata_fields: list[str] = []
    """Fields passed to the verifier as `Problem.metadata` (each must exist)."""
    verifier: Literal["exact", "numeric", "regex", "math"] = "exact"
    """exact: stripped strings equal; numeric: equal as numbers (commas, spaces, trailing
    zeros ignored); regex: the record's answer is a pattern the completion must fullmatch;
    math: math-verify (\\boxed{} or the last number, symbolic equivalence; GSM8K "#### 42"
    references), sub-scores `format` and `answer`."""
    format_weight: float = Field(default=0.0, ge=0, le=1)
    """math verifier only: reward = (1 - format_weight) * answer + format_weight * format."""
    extract: str | None = None
    """Optional regex with one group pulling the answer out of the completion first."""
    eval_fraction: float | None = Field(default=None, ge=0, lt=1)
    """Fraction of records held out for evaluation (chosen by the run seed); unset means
    0.1, or none when `eval_path` or `eval_split` names the evaluation records."""
    max_answer_chars: int = Field(default=32, gt=0)
    """Bound on completion length (characters) used when sampling.max_tokens is unset."""

    @model_validator(mode="after")
    def _check(self) -> DatasetTaskConfig:
        if self.separate_eval and self.eval_fraction is not None:
            raise ValueError("eval_fraction cannot be combined with eval_path or eval_split")
        if self.format_weight and self.verifier != "math":
            raise ValueError(f"format_weight applies to verifier = 'math', not {self.verifier!r}")
        return self

    @property
    def separate_eval(self) -> bool:
        """Whether evaluation records come from `eval_path`/`eval_split`."""
        return self.eval_path is not None or self.eval_split is not None

    @property
    def held_out_fraction(self) -> float:
        """The fraction of `path`'s records held out for evaluation."""
        if self.separate_eval:
            return 0.0
        return DEFAULT_EVAL_FRACTION if self.eval_fraction is None else self.eval_fraction


class ReasoningGymTaskConfig(TaskCommon):
    """A procedural `reasoning-gym` dataset by name, scored by its own `score_answer`
    (needs the orchestrator's `reasoning-gym` extra)."""

    type: Literal["reasoning_gym"] = "reasoning_gym"
    """Task kind."""
    dataset: str = Field(min_length=1)
    """Registered reasoning-gym dataset name ("basic_arithmetic", "leg_counting", ...)."""
    options: dict[str, Any] = {}
    """Keyword arguments of the dataset's config (difficulty knobs; not `seed`/`size`)."""
    eval_size: int = Field(default=100, ge=1)
    """Problems in the held-out evaluation split (training is unbounded)."""
    extract: str | None = None
    """Optional regex with one group pulling the answer out of the completion first
    (e.g. "<answer>(.*?)</answer>"); unset scores the whole stripped completion."""
    max_answer_chars: int = Field(default=64, gt=0)
    """Bound on completion length (characters) used when sampling.max_tokens is unset."""

    @model_validator(mode="after")
    def _check(self) -> ReasoningGymTaskConfig:
        reserved = sorted({"seed", "size"} & self.options.keys())
        if reserved:
            raise ValueError(f"options {reserved} are set by the task (per split), not here")
        return self


class CodeTaskConfig(TaskCommon):
    """Programming problems with unit tests from local records (MBPP- or HumanEval-style),
    run in the sandbox; reward = the fraction of tests passed (see docs/agents.md)."""

    type: Literal["code"] = "code"
    """Task kind."""
    path: Path
    """Records file or folder, read as by the dataset task (`.jsonl` line by line)."""
    prompt_field: str = "text"
    """Field holding the problem statement (MBPP `text`, HumanEval `prompt`)."""
    tests_field: str = "test_list"
    """Field holding the tests: a list of snippets (MBPP `assert` lines), each one test, or
    one string (HumanEval `test`, which defines `check(candidate)`)."""
    reference_field: str = "code"
    """Field holding a correct program (the warm-start target)."""
    setup_field: str | None = None
    """Optional field with code run before the tests (MBPP `test_setup_code`)."""
    entry_point_field: str | None = None
    """HumanEval: the field naming the function under test; the program is then the prompt
    followed by the completion, and the string test ends with `check(<entry point>)`."""
    eval_fraction: float = Field(default=DEFAULT_EVAL_FRACTION, ge=0, lt=1)
    """Fraction of records held out for evaluation (chosen by the run seed)."""
    max_answer_chars: int = Field(default=512, gt=0)
    """Bound on completion length (characters) used when sampling.max_tokens is unset."""
    sandbox: SandboxLimits = SandboxLimits(wall_s=3.0, cpu_s=3)
    """Limits of one program run (one process answers all of a completion's tests); its
    wall_s must stay under orchestrator.timeouts.verifier_s."""
    python_tool: bool = False
    """Offer the policy a `python(code)` tool that runs code in the same sandbox and returns
    its output, so an episode may try code before it answers (needs the chat template on;
    the answer is the last turn, and orchestrator.tools.call_timeout_s must exceed the
    sandbox's wall_s)."""


class VerifiersTaskConfig(TaskCommon):
    """An environment of the `verifiers` library, run by verifiers' own train client against
    inference's `/inference/v1/generate` (needs `inference.http.enabled` and a model folder;
    see docs/agents.md). Optional extra: `tidal-orchestrator[verifiers]`."""

    type: Literal["verifiers"] = "verifiers"
    """Task kind."""
    env: str = Field(min_length=1)
    """The environment's taskset id: an installed (or importable) module exporting its
    `Taskset` subclass, and optionally its `Env`, in `__all__` (verifiers' own lookup)."""
    args: dict[str, Any] = {}
    """The taskset's config fields (its `TasksetConfig`), as `[orchestrator.task.args]`."""
    harness: str = "null"
    """The verifiers harness that plays the policy: `null` is the tool-less chat program,
    run as a local subprocess with the orchestrator's Python; "" takes the taskset's own."""
    max_answer_chars: int = Field(default=512, gt=0)
    """Bound on one model turn's length (characters) used when sampling.max_tokens is unset."""


class ImportTaskConfig(TaskCommon):
    """A plug-in task class named by import path (see docs/tasks.md)."""

    type: Literal["import"] = "import"
    """Task kind."""
    path: str = Field(pattern=r"^[\w.]+:[\w]+$")
    """"package.module:ClassName" of a `tidal.orchestrator.tasks.Task` subclass."""
    options: dict[str, Any] = {}
    """Keyword arguments for the class's constructor."""


ProblemTasks = (
    ReversalTaskConfig
    | ArithmeticTaskConfig
    | CountdownTaskConfig
    | DatasetTaskConfig
    | ReasoningGymTaskConfig
    | CodeTaskConfig
    | LookupTaskConfig
    | ImportTaskConfig
)
"""The tasks that hold their own problems and verifier."""

ProblemSourceConfig = Annotated[ProblemTasks, Field(discriminator="type")]
"""A task whose problems and verifier an agent task uses (any task that is not an agent)."""

AGENT_SANDBOX = SandboxLimits(
    cpu_s=60, memory_mb=2048, processes=64, open_files=256, max_concurrency=64
)


class AgentTaskConfig(TaskCommon):
    """An agent program the user already has, trained through the session gateway: per
    episode it is started in the sandbox (`command`) or asked over HTTP (`url`) with
    OPENAI_BASE_URL and an OPENAI_API_KEY minted for that episode (see docs/agents.md)."""

    type: Literal["agent"] = "agent"
    """Task kind."""
    problems: ProblemSourceConfig
    """The task whose problems the agent gets (on stdin, as JSON) and whose verifier scores
    its final output, as `[orchestrator.task.problems]` with its own `type`."""
    command: list[str] = []
    """The agent's argv, run per episode in the sandbox (its first item an absolute path or
    a name on PATH); its stdout is its final output. Exactly one of command and url."""
    files: list[str] = []
    """Host files and folders the command reads besides its program (a script its
    interpreter runs, its packages, a virtualenv, its data): under bubblewrap the sandbox
    sees only these, the program and the system's files, read-only at the same paths."""
    url: str = ""
    """A long-running agent service: per episode the orchestrator POSTs the session
    (base_url, api_key, session_id, problem) here and the reply's `output` is the final
    output. Exactly one of command and url."""
    self_reward: bool = False
    """The agent posts its own reward to /v1/sessions/{id}/reward (an episode without one
    is dropped); otherwise the problems' verifier (or `reward`, a judge) scores its output."""
    deadline_s: float = Field(default=60.0, gt=0)
    """Wall clock of one episode, from its start (a wait for a sandbox slot included): at it
    the program is killed, the key expires and the episode is dropped, counted."""
    max_calls: int = Field(default=64, gt=0)
    """Chat calls one episode may make; more are refused (429)."""
    max_body_bytes: int = Field(default=4 << 20, gt=0)
    """Largest request body the gateway reads (413 above it, before reading)."""
    sandbox: SandboxLimits = AGENT_SANDBOX
    """Limits of the agent's process (`command`); its `wall_s` is not used: the agent's
    wall clock is `deadline_s`."""

    @model_validator(mode="after")
    def _check(self) -> AgentTaskConfig:
        if bool(self.command) == bool(self.url):
            raise ValueError("set exactly one of command (a program) and url (a service)")
        if self.problems.reward is not None:
            raise ValueError("a judge scores the agent's output: set reward, not problems.reward")
        if self.url and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"url {self.url[:100]!r} must be http:// or https://")
        return self


TaskConfig = Annotated[
    ProblemTasks | VerifiersTaskConfig | AgentTaskConfig, Field(discriminator="type")
]
