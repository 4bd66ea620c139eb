"""The experiment file: the typed schema every run, sweep and re-timing is validated against once, in the driver
(`experiment`, which composes the data, system, model and callback sections their own packages define, and the
`sweep:` section from `sweep`), YAML reading with duplicate keys refused, and command-line overrides."""
from raysim.config.experiment import (AlgorithmConfig, CheckpointConfig, ClusterConfig, ConfigError, EvalConfig,
                                      ExperimentConfig, FaultConfig, apply_overrides, declared_command, dump_config,
                                      load_config, load_plugins, parse_override, read_config_file, read_yaml)
from raysim.config.sweep import SweepConfig

__all__ = ["AlgorithmConfig", "CheckpointConfig", "ClusterConfig", "ConfigError", "EvalConfig", "ExperimentConfig",
           "FaultConfig", "SweepConfig", "apply_overrides", "declared_command", "dump_config", "load_config",
           "load_plugins", "parse_override", "read_config_file", "read_yaml"]
