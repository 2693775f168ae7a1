"""A run's config: its types (schema.py), the one table of rules for its values (rules.py), and how it is
loaded (load.py: presets/<name>.yaml, the `cpu_scale:` block, `--set`).

    from trainer.config import RunConfig, load_config, check_config, ConfigError
    cfg = load_config("furniture_train", cpu_scale=True, overrides={"train.steps": 10})
    check_config(cfg)               # ConfigError naming the key, the value and what is allowed

schema.py imports nothing of the project; rules.py imports schema; load.py imports both. This package's
public names are re-exported here so callers need not know which of the three holds them. Beside them:
perf.py (the speed options, resolved for a device) and released.py (a released checkpoint's config.json,
the third source of a model's dimensions after the YAML and `--set`); neither imports torch, so the
launcher plans and refuses on a login node without it.
"""

from trainer.config.load import (
    CONFIG_DIR,
    CPU_SCALE_MARK,
    SET,
    apply_overrides,
    available_configs,
    config_from_dict,
    load_config,
    parse_set,
    resolve_config,
    user_set,
)
from trainer.config.rules import ATTENTION, BEST_BY, CAMERA_NAMES, DATASETS, ENCODERS, check, violations
from trainer.config.schema import (
    HANG_POLICIES,
    CheckpointConfig,
    ConfigError,
    DataConfig,
    HangConfig,
    InferConfig,
    LogConfig,
    ModelConfig,
    PlanConfig,
    ProfileConfig,
    RecipeConfig,
    RunConfig,
    TrainConfig,
)

check_config = check  # the name callers outside this package use: check_config(cfg, sources)

__all__ = [
    "ATTENTION",
    "BEST_BY",
    "CAMERA_NAMES",
    "CONFIG_DIR",
    "CPU_SCALE_MARK",
    "DATASETS",
    "ENCODERS",
    "HANG_POLICIES",
    "SET",
    "CheckpointConfig",
    "ConfigError",
    "DataConfig",
    "HangConfig",
    "InferConfig",
    "LogConfig",
    "ModelConfig",
    "PlanConfig",
    "ProfileConfig",
    "RecipeConfig",
    "RunConfig",
    "TrainConfig",
    "apply_overrides",
    "available_configs",
    "check",
    "check_config",
    "config_from_dict",
    "load_config",
    "parse_set",
    "resolve_config",
    "user_set",
    "violations",
]
