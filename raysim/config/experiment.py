"""The experiment file: a typed schema, validated before Ray starts, with command-line overrides.

Every error names the field (`data.test_fraction`, `algorithm.lr`, ...) and what it allows; the
algorithm's own hyperparameters are checked against the `Params` class it registered.
"""
from __future__ import annotations

import copy
import dataclasses
import math
import re
from collections.abc import Hashable
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from raysim.callbacks.config import CallbackConfig, MetricEntry
from raysim.config.sweep import SweepConfig
from raysim.core.field_errors import coercion_problems, field_errors
from raysim.data.config import DataConfig
from raysim.data.sources import natural_count
from raysim.errors import ConfigError, DataError, PluginError
from raysim.models import ModelConfig
from raysim.plugins import ALGORITHMS, load_plugin
from raysim.schedule.config import ScheduleConfig
from raysim.system.config import SystemConfig
from raysim.system.ledger import Ledger


class AlgorithmConfig(BaseModel):
    """The `algorithm:` section: a registered name, the round budget, and the family's hyperparameters."""

    model_config = ConfigDict(extra="allow")

    name: str = "fedavg"
    rounds: int = Field(10, ge=1)
    clients_per_round: int = Field(10, ge=1)
    vectorize: bool = Field(True, description="run a shard's clients at once (vmap) where the family supports it")

    def hyperparameters(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class ClusterConfig(BaseModel):
    """The `cluster:` section: where Ray runs and how clients are packed into actors."""

    model_config = ConfigDict(extra="forbid")

    address: str | None = Field(None, description="Ray address; None starts a local Ray")
    num_actors: int | None = Field(None, ge=1, description="client actors; default: one per CPU")
    clients_per_actor: int | None = Field(None, ge=1, description="clients an actor hosts; when set it decides the"
                                          " number of actors (num_actors is not used): 1 gives one actor per client")
    cpus_per_actor: float | None = Field(None, gt=0, description="default: the CPUs shared evenly")
    gpu_fraction: float | None = Field(None, gt=0, le=1, description="GPU share per actor when GPUs exist; default 1/num_actors")
    num_cpus: int | None = Field(None, ge=1, description="CPUs of a locally started Ray, and the threads of the"
                                 " local backend's batched steps; default: all")
    torch_threads: int = Field(1, ge=1, description="torch threads per client actor (at most its CPU share); 1 keeps"
                               " results bitwise equal in every layout, as torch's sums depend on the thread count")
    server: Literal["auto", "driver", "actor"] = Field(
        "auto", description="where the server's round logic runs on Ray: in the driver's process, or in an actor of"
                            " its own; auto: the driver, unless it joins through Ray Client (a ray:// address)")
    driver_shard: bool | None = Field(
        None, description="the driver's process hosts the first shard of clients itself, in place of one client actor"
                          " (one torch process fewer to start and hold); default: when the server runs in the driver"
                          " on a one-node CPU cluster under the virtual clock without injected faults")


class CheckpointConfig(BaseModel):
    """The `checkpoint:` section: how often server and client state are saved (restarts, --resume)."""

    model_config = ConfigDict(extra="forbid")

    every: int = Field(10, ge=0, description="rounds between checkpoints on disk; 0: never")
    replay_rounds: int = Field(20, ge=1, description="rounds a restarted client actor may replay: after as many rounds"
                               " without a checkpoint, client states are snapshotted in memory and older broadcasts released")


class FaultConfig(BaseModel):
    """One injected fault (for tests and fault studies): client actor `actor` dies in the middle of round `round`."""

    model_config = ConfigDict(extra="forbid")

    round: int = Field(ge=1)
    actor: int = Field(ge=0, description="index of the client actor, 0..num_actors-1")


class ClientSample(BaseModel):
    """`eval.clients: {sample: N}`: N clients drawn afresh (seeded) at every evaluated round."""

    model_config = ConfigDict(extra="forbid")

    sample: int = Field(ge=1)


class AdaptiveClip(BaseModel):
    """`privacy.adaptive_clip`: the clip norm tracks a quantile of the updates' norms (Andrew et al., 2021)."""

    model_config = ConfigDict(extra="forbid")

    quantile: float = Field(0.5, gt=0, lt=1, description="γ, the fraction of updates the clip norm should hold")
    lr: float = Field(0.2, gt=0, description="η_C of the geometric update C ← C·exp(−η_C (b̃ − γ))")
    count_noise: float | None = Field(None, gt=0, description="σ_b, the noise on the count within the norm;"
                                      " default clients_per_round / 20")


class PrivacyConfig(BaseModel):
    """The `privacy:` section: DP-FedAvg (McMahan et al., 2018), user-level central differential privacy. Each
    client's update is clipped to L2 norm `clip`; the server adds Gaussian noise of std noise_multiplier x clip to
    their sum and divides by the clients selected a round. The privacy spent is accounted by Rényi DP for the
    sampling used (a fixed number of clients drawn without replacement, replace-one neighbours)."""

    model_config = ConfigDict(extra="forbid")

    clip: float = Field(gt=0, description="C, the L2 norm each client's update is clipped to (the first round's, adaptively)")
    adaptive_clip: AdaptiveClip | None = Field(None, description="move C towards a quantile of the update norms")
    noise_multiplier: float | None = Field(None, ge=0, description="z: the noise's std is z x C; or give target_epsilon")
    target_epsilon: float | None = Field(None, gt=0, description="the z that spends at most this ε over the run's rounds")
    delta: float = Field(1e-5, gt=0, lt=1, description="δ of the (ε, δ) reported and targeted")

    @model_validator(mode="after")
    def _one_noise(self) -> PrivacyConfig:
        if (self.noise_multiplier is None) == (self.target_epsilon is None):
            raise ValueError("give exactly one of noise_multiplier and target_epsilon")
        return self


class EvalConfig(BaseModel):
    """The `eval:` section."""

    model_config = ConfigDict(extra="forbid")

    every: int = Field(1, ge=1, description="evaluate every this many rounds (and at the last)")
    train_samples: int = Field(20000, ge=0, description="pooled training samples evaluated for train_loss")
    test_samples: int | None = Field(None, ge=1, description="evaluate a seeded sample of at most this many test"
                                     " samples (the same every round); None: the whole test set")
    clients: Literal["none", "selected", "all"] | ClientSample = Field(
        "none", description="federated evaluation: the global model on each chosen client's own data, on the clients'"
                            " actors, every `every` rounds: none, the round's selected clients, all, or {sample: N}")


class ExperimentConfig(BaseModel):
    """One experiment: data, model, algorithm, system model, cluster."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field("experiment", pattern=r"^[A-Za-z0-9_.-]+$")
    seed: int = Field(0, ge=0)
    data: DataConfig
    model: ModelConfig = Field(default_factory=ModelConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    system: SystemConfig = Field(default_factory=SystemConfig)
    schedule: ScheduleConfig = Field(default_factory=ScheduleConfig, description="when the server applies updates: sync"
                                     " rounds, FedBuff's buffered or FedAsync's async aggregation")
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    privacy: PrivacyConfig | None = Field(None, description="DP-FedAvg: clipped client updates, Gaussian noise at the"
                                          " server, ε accounted per round")
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    faults: list[FaultConfig] = Field(default_factory=list)
    callbacks: list[CallbackConfig] = Field(default_factory=list, description="tensorboard, csv, wandb, mlflow, early_stopping, best_model")
    sweep: SweepConfig | None = Field(None, description="read by `raysim sweep` only")
    plugins: list[str] = Field(default_factory=list, description="modules or .py files to import first (your own algorithms, data, models)")
    command: str = Field("run", description="the raysim command this file is for (run, sweep, or a family's command)")
    backend: Literal["ray", "local"] = Field("ray", description="ray: server and client actors; local: the whole run in this process (same numbers)")

    def algorithm_params(self) -> BaseModel:
        """The algorithm's hyperparameters, validated by its registered `Params` class."""
        return ALGORITHMS.lookup(self.algorithm.name).Params(**self.algorithm.hyperparameters())

    def evaluates(self, round: int) -> bool:
        """Whether `round` is evaluated: every `eval.every` rounds and the last."""
        return round % self.eval.every == 0 or round == self.algorithm.rounds

    def clients_to_select(self) -> int:
        """Clients the server selects a round: clients_per_round plus over-selected stragglers."""
        return self.algorithm.clients_per_round + self.system.stragglers.over_select

    def actor_layout(self, cpus: int) -> tuple[int, int]:
        """(number of client actors, clients per actor) for a cluster with `cpus` CPUs."""
        n = self.data.num_clients
        if self.cluster.clients_per_actor is not None:
            per = self.cluster.clients_per_actor
            return math.ceil(n / per), per
        actors = min(self.cluster.num_actors or max(1, cpus), n)
        return actors, math.ceil(n / actors)


def _algorithm_problems(section: Any) -> list[str]:
    """The algorithm section checked against the `Params` class its family registered."""
    if not isinstance(section, dict):
        return []
    try:
        algo = AlgorithmConfig.model_validate(section)
        ALGORITHMS.lookup(algo.name).Params(**algo.hyperparameters())
    except ValidationError as e:
        return field_errors(e, "algorithm")
    except ValueError as e:
        return [f"algorithm.name: {e}"]
    return []


def _check(cfg: ExperimentConfig) -> list[str]:
    """Checks that span sections."""
    problems = _algorithm_problems(cfg.algorithm.model_dump())
    if not problems:
        problems += ALGORITHMS.lookup(cfg.algorithm.name).config_problems(cfg.algorithm_params(), cfg)
    select = cfg.clients_to_select()
    if select > cfg.data.num_clients:
        problems.append(
            f"algorithm.clients_per_round: {cfg.algorithm.clients_per_round} clients a round"
            f" (+{cfg.system.stragglers.over_select} over-selected) exceeds data.num_clients={cfg.data.num_clients}")
    if not problems:
        problems += _metric_problems(cfg)
    if cfg.eval.clients != "none" and not problems and not ALGORITHMS.lookup(cfg.algorithm.name).evaluates_clients():
        problems.append(f"eval.clients: algorithm {cfg.algorithm.name!r} cannot evaluate on clients (it defines no"
                        " evaluate_clients); use eval.clients: none")
    problems += cfg.schedule.problems()
    problems += _trace_problems(cfg)
    if cfg.system.availability.kind != "always" and not problems:
        problems += _availability_problems(cfg)
    if cfg.schedule.scheduled and not problems:
        problems += _schedule_problems(cfg)
    if cfg.privacy is not None and not problems:
        problems += _privacy_problems(cfg)
    if isinstance(cfg.eval.clients, ClientSample) and cfg.eval.clients.sample > cfg.data.num_clients:
        problems.append(f"eval.clients.sample: {cfg.eval.clients.sample} exceeds data.num_clients={cfg.data.num_clients}")
    if cfg.faults and cfg.system.clock.mode != "virtual":
        problems.append("faults: injected faults need system.clock.mode 'virtual' (the real clock drops late clients)")
    if cfg.backend == "local" and cfg.faults:
        problems.append("faults: injected faults kill client actors; they need backend 'ray'")
    if cfg.backend == "local" and cfg.system.clock.mode != "virtual":
        problems.append("system.clock.mode: the real clock waits for client actors in real time; it needs backend 'ray'")
    problems += [f"faults.{i}.round: {f.round} is after the last round ({cfg.algorithm.rounds})"
                 for i, f in enumerate(cfg.faults) if f.round > cfg.algorithm.rounds]
    c = cfg.cluster
    if c.driver_shard and cfg.system.clock.mode != "virtual":
        problems.append("cluster.driver_shard: the real clock times each client in a client actor; it needs"
                        " system.clock.mode 'virtual'")
    if c.driver_shard and cfg.faults:
        problems.append("cluster.driver_shard: injected faults kill client actors; shard 0 would be the driver itself")
    return problems


def _metric_problems(cfg: ExperimentConfig) -> list[str]:
    """A callback's `metric` that the run will not have: neither among the algorithm's declared metrics nor the
    ledger's totals."""
    names = ALGORITHMS.lookup(cfg.algorithm.name).metric_names(cfg)
    if names is None:
        return []
    known = names | {f.name for f in dataclasses.fields(Ledger)}
    return [f"callbacks.{i}.metric: {e.metric!r} is not a result of this run; it has {', '.join(sorted(known))}"
            for i, e in enumerate(cfg.callbacks) if isinstance(e, MetricEntry) and e.metric not in known]


def _trace_problems(cfg: ExperimentConfig) -> list[str]:
    """A speed or availability trace that cannot be read, names clients the federation lacks, or is inconsistent."""
    from raysim.system.traces import availability_trace, speed_trace

    compute, avail, n = cfg.system.compute, cfg.system.availability, cfg.data.num_clients
    checks = [("system.compute.speed_file", compute.speed_file, speed_trace, compute.speed == "trace"),
              ("system.availability.file", avail.file, availability_trace, avail.kind == "trace")]
    problems = []
    for field, path, read, used in checks:
        if used and path:
            try:
                read(path, n)
            except DataError as e:
                problems.append(f"{field}: {e}")
    return problems


def _availability_problems(cfg: ExperimentConfig) -> list[str]:
    """What keeps `system.availability` from holding for this run."""
    name, kind = cfg.algorithm.name, cfg.system.availability.kind
    if not ALGORITHMS.lookup(name).schedulable():
        return [f"system.availability: algorithm {name!r} chooses its own clients; availability {kind!r} needs an"
                " algorithm with the uniform sampler (fedavg, fedprox and the FedOpt server optimizers)"]
    if cfg.system.clock.mode != "virtual":
        return ["system.availability: clients come and go on the virtual clock; it needs system.clock.mode 'virtual'"]
    if kind == "trace" and cfg.schedule.scheduled:
        from raysim.system.availability import Availability

        ever = Availability(cfg.system.availability, cfg.seed, cfg.data.num_clients).ever()
        c = cfg.schedule.resolved(cfg.algorithm.clients_per_round).concurrency
        if c is not None and ever < c:
            return [f"system.availability.file: only {ever} clients are ever online, fewer than schedule.concurrency"
                    f" {c}"]
    return []


def _schedule_problems(cfg: ExperimentConfig) -> list[str]:
    """What keeps a buffered or async schedule from running this experiment, one line each."""
    kind, name = cfg.schedule.kind, cfg.algorithm.name
    s = cfg.schedule.resolved(cfg.algorithm.clients_per_round)
    assert s.concurrency is not None and s.buffer is not None  # resolved
    if not ALGORITHMS.lookup(name).schedulable():
        return [f"schedule.kind: algorithm {name!r} cannot run {kind}: it must be reducible and tell its clients' costs"
                " before they train and weigh a late reply (plan_costs, stale); fedavg, fedprox and the FedOpt server"
                " optimizers can"]
    problems = []
    if s.concurrency > cfg.data.num_clients:
        problems.append(f"schedule.concurrency: {s.concurrency} clients training at once exceed data.num_clients="
                        f"{cfg.data.num_clients}")
    if s.buffer > s.concurrency:
        problems.append(f"schedule.buffer: {s.buffer} arrivals a server update can never gather with concurrency"
                        f" {s.concurrency} clients training at once")
    if cfg.privacy is not None:
        problems.append(f"privacy: DP-FedAvg's accounting is for synchronous rounds of sampled clients; it cannot"
                        f" run under schedule.kind {kind!r}")
    if cfg.system.stragglers.deadline is not None or cfg.system.stragglers.over_select:
        problems.append(f"system.stragglers: deadlines and over-selection close a synchronous round; under"
                        f" schedule.kind {kind!r} the server applies the first schedule.buffer arrivals")
    if cfg.system.clock.mode != "virtual":
        problems.append(f"system.clock.mode: schedule.kind {kind!r} runs on the virtual clock only")
    if cfg.faults:
        problems.append(f"faults: injected faults are keyed by synchronous rounds; schedule.kind {kind!r} has none")
    return problems


def _privacy_problems(cfg: ExperimentConfig) -> list[str]:
    """What keeps `privacy:` from holding for this run: an algorithm that does not clip and noise its updates, clients
    selected among those online (not the uniform sampling the accountant assumes), and a target ε no noise reaches."""
    algo = ALGORITHMS.lookup(cfg.algorithm.name)
    if not getattr(algo, "supports_privacy", False):
        return [f"privacy: algorithm {cfg.algorithm.name!r} has no DP-FedAvg form (fedavg, fedprox and the FedOpt"
                " server optimizers have); remove the privacy section"]
    if cfg.system.availability.kind != "always":
        return [f"privacy: the accountant assumes each round's clients drawn uniformly from all "
                f"{cfg.data.num_clients}, but system.availability {cfg.system.availability.kind!r} selects only online"
                " ones, so the stated ε would not bound the privacy spent; use availability 'always'"]
    p = cfg.privacy
    assert p is not None
    z = p.noise_multiplier
    if p.target_epsilon is not None:
        from raysim.core.privacy import calibrated_noise  # dp-accounting: only when a run targets an ε

        try:
            z = calibrated_noise(cfg.data.num_clients, cfg.clients_to_select(), cfg.algorithm.rounds, p.target_epsilon, p.delta)
        except ValueError as e:
            return [f"privacy.target_epsilon: {e}"]
    if p.adaptive_clip is not None and z:
        sigma_b = p.adaptive_clip.count_noise or cfg.algorithm.clients_per_round / 20
        if 2 * sigma_b <= z:
            return [f"privacy.adaptive_clip.count_noise: {sigma_b:g} must exceed the noise multiplier's half,"
                    f" {z / 2:g} (Andrew et al., 2021, Thm. 1)"]
    return []


def _set_path(tree: dict, dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node = tree
    for k in keys[:-1]:
        if not isinstance(node.setdefault(k, {}), dict):
            raise ConfigError(f"{dotted}: cannot override inside non-mapping field {k!r}")
        node = node[k]
    node[keys[-1]] = value


def apply_overrides(tree: dict, overrides: list[str] | dict[str, Any]) -> dict:
    """Apply `key.sub=value` strings (values parsed as YAML) or a {dotted key: value} mapping."""
    items = overrides.items() if isinstance(overrides, dict) else [parse_override(o) for o in overrides]
    for key, value in items:
        _set_path(tree, key, value)
    return tree


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2's numbers: `1e-6` and `1.5e3` are floats, not the strings YAML 1.1
    makes of them (a typed field would coerce them, but a sweep's `grid: [1e-6]` would search strings); and a
    key repeated in one mapping is an error, where PyYAML keeps the last (a second `algorithm:` replaced the first)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        """The mapping, refused when a key appears twice in it (a `<<:` merge may still be overridden)."""
        if isinstance(node, yaml.MappingNode):
            first: dict[Any, yaml.Node] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node)
                if isinstance(key, Hashable) and key in first:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {key!r}, first at line {first[key].start_mark.line + 1}; again",
                        key_node.start_mark)
                if isinstance(key, Hashable):
                    first[key] = key_node
        return super().construct_mapping(node, deep)


_Loader.add_implicit_resolver("tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
                              list("-+0123456789"))


def read_yaml(text: str) -> Any:
    """YAML text as Python values, exponents as floats and repeated keys refused (see _Loader)."""
    return yaml.load(text, Loader=_Loader)


def read_config_file(path: str | Path) -> Any:
    """A config file's YAML as Python values; a ConfigError naming the file when it is missing, not UTF-8 or not YAML."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist" if not path.exists()
                          else f"config file {str(path)!r} is not a file")
    try:
        return read_yaml(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        what = _yaml_problem(e) if isinstance(e, yaml.YAMLError) else f"not UTF-8 text ({e.reason} at byte {e.start})"
        raise ConfigError(f"not valid YAML: {what}", str(path)) from None


def parse_override(item: str) -> tuple[str, Any]:
    """`key.sub=value` as (dotted key, YAML-parsed value)."""
    if "=" not in item:
        raise ConfigError(f"override {item!r}: expected key.sub=value")
    key, raw = item.split("=", 1)
    try:
        return key.strip(), read_yaml(raw)
    except yaml.YAMLError as e:
        raise ConfigError(f"override {key.strip()}: {raw!r} is not a YAML value ({_yaml_problem(e)})") from None


def _yaml_problem(err: yaml.YAMLError) -> str:
    """A YAML parser error as one phrase with its line and column (1-based)."""
    mark = getattr(err, "problem_mark", None)
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    return f"{problem} at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else problem


def load_config(source: str | Path | dict | ExperimentConfig, overrides: list[str] | dict | None = None) -> ExperimentConfig:
    """Read, override and validate an experiment; raises ConfigError naming every bad field."""
    where = str(source) if isinstance(source, (str, Path)) else None
    if isinstance(source, ExperimentConfig):
        tree = source.model_dump(mode="json")
    elif isinstance(source, dict):
        tree = copy.deepcopy(source)
    else:
        path = Path(source)
        tree = read_config_file(path)
        if tree is None:
            raise ConfigError("the file is empty; an experiment needs at least data: (source, num_clients)", str(path))
        if not isinstance(tree, dict):
            raise ConfigError("the top level must be a mapping of sections (data:, model:, algorithm:, ...)", str(path))
        if isinstance(tree.get("plugins"), list):  # a plugin file next to the config is found from anywhere
            tree["plugins"] = [str(path.parent / s) if isinstance(s, str) and s.endswith(".py") and (path.parent / s).is_file()
                               else s for s in tree["plugins"]]
    tree = apply_overrides(tree, overrides or [])
    load_plugins(tree.get("plugins"))
    try:
        cfg = ExperimentConfig.model_validate(tree)
    except ValidationError as e:
        problems = field_errors(e)
        problems += [p for p in _algorithm_problems(tree.get("algorithm")) if p not in problems]
        raise ConfigError(problems, where) from None
    cfg = _counted(cfg, where)
    problems = _coerced(tree, cfg) + _check(cfg)
    if problems:
        raise ConfigError(problems, where)
    return cfg


def _counted(cfg: ExperimentConfig, where: str | None) -> ExperimentConfig:
    """`cfg` with data.num_clients, when left out under the natural partition, set to the source's own count."""
    data = cfg.data
    if data.num_clients:
        return cfg
    if data.partition.kind != "natural":
        raise ConfigError("data.num_clients: give the number of clients (only partition natural takes the source's"
                          " own count)", where)
    n = natural_count(data)
    if n is None:
        raise ConfigError(f"data.num_clients: source {data.source!r} cannot count its clients before it loads them;"
                          " give data.num_clients", where)
    return cfg.model_copy(update={"data": data.model_copy(update={"num_clients": n})})


def _coerced(tree: dict, cfg: ExperimentConfig) -> list[str]:
    """The values of `tree` that validated only by pydantic's lax coercion (see `coercion_problems`): in every
    section, and in the algorithm's and the data source's own parameters, which their plugins' models check."""
    problems = coercion_problems(tree, cfg)
    data = tree.get("data")
    problems += coercion_problems(data.get("options") if isinstance(data, dict) else None, cfg.data.source_options(),
                                  "data.options")
    if not _algorithm_problems(tree.get("algorithm")):  # else _check reports them
        problems += coercion_problems(tree.get("algorithm"), cfg.algorithm_params(), "algorithm")
    return list(dict.fromkeys(problems))


def declared_command(path: str | Path) -> str | None:
    """The `command:` a YAML file declares (None when it declares none or is not a mapping); a ConfigError
    naming the file when it cannot be read as YAML, as `load_config` would raise."""
    tree = read_config_file(path)
    command = tree.get("command") if isinstance(tree, dict) else None
    return command if isinstance(command, str) else None


def load_plugins(specs: Any) -> None:
    """Import the config's `plugins:` (module names or .py files) so their names validate."""
    if specs is None:
        return
    if not isinstance(specs, list) or not all(isinstance(s, str) for s in specs):
        raise ConfigError(f"plugins: expected a list of module names or .py files, got {specs!r}")
    for spec in specs:
        try:
            load_plugin(spec)
        except PluginError as e:
            raise ConfigError(f"plugins: {e}") from None


def dump_config(cfg: ExperimentConfig) -> str:
    """The fully resolved config as YAML (defaults filled in), as written next to the results."""
    tree = cfg.model_dump(mode="json")
    tree["algorithm"] = {**{k: tree["algorithm"][k] for k in ("name", "rounds", "clients_per_round", "vectorize")},
                         **cfg.algorithm_params().model_dump(mode="json")}
    return yaml.safe_dump(tree, sort_keys=False)
