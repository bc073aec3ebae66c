"""What is trained (layer 1: imports only pydantic and the stdlib).

- `ModelSpec`, `TrainingSpec` (`model_specs.spec`): model shape and training setup.
- `count_params` (`model_specs.params`): exact parameter counts, total and active.
- `from_hf_config`, `load_hf_config`, `load_hf_spec` (`model_specs.hf`): HuggingFace config.json import.
- `get_model`, `list_models`, `PRESETS` (`model_specs.presets`): named models.
"""

from model_specs.hf import ModelConfigError, from_hf_config, load_hf_config, load_hf_spec
from model_specs.params import ParamCounts, count_params
from model_specs.presets import PRESETS, UnknownModelError, get_model, list_models
from model_specs.spec import ModelSpec, TrainingSpec

__all__ = [
    "PRESETS",
    "ModelConfigError",
    "ModelSpec",
    "ParamCounts",
    "TrainingSpec",
    "UnknownModelError",
    "count_params",
    "from_hf_config",
    "get_model",
    "list_models",
    "load_hf_config",
    "load_hf_spec",
]
