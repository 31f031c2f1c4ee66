"""Hugging Face causal language models (``transformers``, the ``hf`` extra) as Composer models.

A recipe names one with ``model: {name: hf_causal_lm, ...}``, llm-foundry's spelling, in one of two ways:

* ``config: {model_type: gpt2, n_layer: 2, ...}``: a ``transformers`` config, built with random weights;
* ``pretrained_model_name_or_path: DIR``: a local directory written by ``save_pretrained`` (weights loaded; with
  ``pretrained: false`` only its config is used), optionally changed by ``config_overrides``.

Nothing is downloaded: fetch a Hub model into a directory first (``hf download gpt2 --local-dir DIR``). The
network is wrapped in Composer's ``HuggingFaceModel``; each transformer block (the classes the model lists in
``_no_split_modules``) is one FSDP unit, and the unit of activation checkpointing. Batches are the token samples
of :mod:`composer_qsdp.recipes.data` as ``{"input_ids", "labels"}`` (:func:`causal_lm_batch`): the model shifts the labels
itself, so the loss is next-token cross entropy as for :class:`~composer_qsdp.recipes.models.ComposerGPT`.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from composer_qsdp._names import did_you_mean

__all__ = ["HFCausalLMConfig", "build_hf_causal_lm", "causal_lm_batch", "hf_causal_lm_config"]

# Files from which from_pretrained loads weights (single file or sharded index, safetensors or torch).
_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                 "pytorch_model.bin.index.json")


@dataclass(frozen=True)
class HFCausalLMConfig:
    """A checked Hugging Face causal LM: what to build, and the sample length the data must have.

    Attributes:
        config: the ``transformers`` model config (a ``PretrainedConfig``), overrides applied.
        weights: directory to load the pretrained weights from, or None for random initialisation.
        max_seq_len: tokens per training sample.
        block_classes: class names of the transformer blocks; each block is one FSDP unit.
    """

    config: Any
    weights: str | None
    max_seq_len: int
    block_classes: tuple[str, ...]

    @property
    def vocab_size(self) -> int:
        """Rows of the token embedding."""
        return self.config.vocab_size


def _transformers() -> Any:
    try:
        return importlib.import_module("transformers")
    except ImportError as err:
        raise ImportError("Hugging Face models need transformers, which the hf extra installs: "
                          "pip install 'composer_qsdp[hf]'") from err


def _check_fields(config_class: type, values: Mapping[str, Any], where: str) -> None:
    """Refuse keys that ``config_class`` does not define: transformers configs store unknown keyword arguments
    silently, so a misspelt ``n_layers`` would train the default depth."""
    default = config_class()
    known = set(default.to_dict()) | set(getattr(config_class, "attribute_map", {}))
    for key in values:
        if key not in known:
            raise ValueError(f"{where}: {config_class.__name__} has no field {key!r}{did_you_mean(key, known)}")


def _config_from_dict(values: Mapping[str, Any]) -> Any:
    transformers = _transformers()
    values = dict(values)
    model_type = values.pop("model_type", None)
    names = sorted(transformers.CONFIG_MAPPING.keys())
    if not isinstance(model_type, str):
        raise ValueError(f"config needs a model_type (a string such as 'gpt2', 'llama'), got {model_type!r}")
    if model_type not in names:
        raise ValueError(f"config.model_type={model_type!r} is not a transformers model type"
                         f"{did_you_mean(model_type, names)}")
    config_class = transformers.CONFIG_MAPPING[model_type]
    _check_fields(config_class, values, "config")
    return config_class(**values)


def _config_from_directory(path: str, pretrained: bool) -> Any:
    directory = Path(path)
    if not (directory / "config.json").is_file():
        raise ValueError(f"pretrained_model_name_or_path={path!r} must be a local directory holding config.json "
                         "(nothing is downloaded: fetch a Hub model first, e.g. hf download gpt2 --local-dir DIR)")
    if pretrained and not any((directory / name).is_file() for name in _WEIGHT_FILES):
        raise ValueError(f"pretrained_model_name_or_path={path!r} holds no weights ({', '.join(_WEIGHT_FILES)}); "
                         "set pretrained: false to start from its config with random weights")
    return _transformers().AutoConfig.from_pretrained(directory)


def hf_causal_lm_config(
    config: Mapping[str, Any] | None = None,
    pretrained_model_name_or_path: str | None = None,
    pretrained: bool | None = None,
    config_overrides: Mapping[str, Any] | None = None,
    max_seq_len: int | None = None,
) -> HFCausalLMConfig:
    """Check a Hugging Face causal-LM description (the keys of a recipe's ``model`` section) without building it.

    Args:
        config: a ``transformers`` config as a mapping with ``model_type``; random weights.
        pretrained_model_name_or_path: a local ``save_pretrained`` directory (instead of ``config``).
        pretrained: load the directory's weights (the default, as in llm-foundry); false takes only its config.
        config_overrides: config fields that replace the directory's (or ``config``'s) values.
        max_seq_len: tokens per sample; default the model's ``max_position_embeddings``, and at most that.

    Raises:
        ValueError: a missing or doubled source, an unknown model type or config field, a directory without
            config or weights, a model without a causal-LM head or transformer blocks, or a bad ``max_seq_len``
            (the shards' token ids are checked against the vocabulary when they are read).
        ImportError: ``transformers`` is not installed.
    """
    if (config is None) == (pretrained_model_name_or_path is None):
        raise ValueError("give exactly one of config (a transformers config with model_type) and "
                         "pretrained_model_name_or_path (a local directory)")
    if pretrained is not None and not isinstance(pretrained, bool):
        raise ValueError(f"pretrained={pretrained!r} must be true or false")
    if config is not None:
        if pretrained:
            raise ValueError("pretrained: true needs pretrained_model_name_or_path; a config alone has no weights")
        hf_config = _config_from_dict(config)
        weights = None
    else:
        pretrained = pretrained is not False
        hf_config = _config_from_directory(pretrained_model_name_or_path, pretrained)
        weights = pretrained_model_name_or_path if pretrained else None
    if config_overrides:
        _check_fields(type(hf_config), config_overrides, "config_overrides")
        hf_config.update(dict(config_overrides))

    _transformers()  # the clear ImportError first
    mapping = importlib.import_module("transformers.models.auto.modeling_auto").MODEL_FOR_CAUSAL_LM_MAPPING
    if type(hf_config) not in mapping:
        raise ValueError(f"model_type {hf_config.model_type!r} has no causal-LM model in transformers "
                         "(AutoModelForCausalLM)")
    blocks = tuple(mapping[type(hf_config)]._no_split_modules or ())
    if not blocks:
        raise ValueError(f"{mapping[type(hf_config)].__name__} names no transformer block class "
                         "(_no_split_modules), so FSDP cannot shard it block by block")
    longest = getattr(hf_config, "max_position_embeddings", None)
    if max_seq_len is None:
        max_seq_len = longest
    if isinstance(max_seq_len, bool) or not isinstance(max_seq_len, int) or max_seq_len < 1:
        raise ValueError(f"max_seq_len={max_seq_len!r} is invalid; it must be an integer >= 1 (the shards' "
                         "sample length)")
    if longest is not None and max_seq_len > longest:
        raise ValueError(f"max_seq_len={max_seq_len} exceeds the model's max_position_embeddings={longest}")
    return HFCausalLMConfig(config=hf_config, weights=weights, max_seq_len=max_seq_len, block_classes=blocks)


def build_hf_causal_lm(spec: HFCausalLMConfig) -> Any:
    """The network of ``spec`` (pretrained weights or random ones from the current torch seed) in Composer's
    ``HuggingFaceModel``, reporting cross entropy and perplexity on evaluation."""
    from composer.metrics.nlp import LanguageCrossEntropy, LanguagePerplexity
    from composer.models import HuggingFaceModel

    auto = _transformers().AutoModelForCausalLM
    network = auto.from_pretrained(spec.weights, config=spec.config) if spec.weights else auto.from_config(spec.config)

    def is_block(module: Any) -> bool:
        return type(module).__name__ in spec.block_classes

    # Composer's FSDP2 policy asks the wrapped network's fsdp_wrap_fn which submodules become units, and
    # activation checkpointing asks its activation_checkpointing_fn.
    network.fsdp_wrap_fn = is_block
    network.activation_checkpointing_fn = is_block
    # Training reports no metrics: its loss is the cross entropy already (as ComposerGPT does).
    return HuggingFaceModel(network, use_logits=True, metrics=[],
                            eval_metrics=[LanguageCrossEntropy(), LanguagePerplexity()], shift_labels=True)


def causal_lm_batch(samples: Sequence[Any]) -> dict[str, Any]:
    """``DataLoader`` collate function: token samples -> ``{"input_ids", "labels"}`` of shape ``[batch, seq]``;
    the model shifts the labels by one position itself."""
    import torch

    tokens = torch.stack(list(samples))
    # A copy: Composer's HuggingFaceModel.eval_forward shifts the labels in place.
    return {"input_ids": tokens, "labels": tokens.clone()}
