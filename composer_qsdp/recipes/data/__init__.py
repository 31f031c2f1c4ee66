"""Training data: text -> tokens (GPT-2, or any local Hugging Face tokenizer directory with the ``hf`` extra) ->
fixed-length samples -> MDS shards -> ``StreamingDataset`` batches.

Build shards from the command line with ``python -m composer_qsdp.recipes.data.build`` (see
:mod:`composer_qsdp.recipes.data.build`), read them with :func:`build_token_dataloader`. Reading refuses shards
whose sample length differs from the model's ``max_seq_len`` (:func:`check_sample_length`, from ``index.json``)
and shard files that fail the hash their ``index.json`` records (:mod:`composer_qsdp.recipes.data.integrity`);
``docs/data.md`` describes both.
"""

from composer_qsdp.recipes.data.dataloader import TokenSamples, build_token_dataloader
from composer_qsdp.recipes.data.integrity import SHARD_HASHES, UnreadableShardError, verify_shard_file
from composer_qsdp.recipes.data.shards import (
    SplitStats,
    check_sample_length,
    sample_length,
    shards_exist,
    write_token_shards,
)
from composer_qsdp.recipes.data.sources import (
    TRAIN_SPLIT,
    VAL_SPLIT,
    assign_split,
    c4_documents,
    c_source_documents,
    default_python_source_roots,
    prose_documents,
    python_source_documents,
    python_source_files,
    source_files,
    text_directory_documents,
    wikipedia_sample_documents,
)
from composer_qsdp.recipes.data.tokenizer import (
    EOT_TOKEN_ID,
    TextTokenizer,
    gpt2_tokenizer,
    load_tokenizer,
    write_gpt2_tokenizer,
)

__all__ = [
    "EOT_TOKEN_ID",
    "SHARD_HASHES",
    "SplitStats",
    "TRAIN_SPLIT",
    "TextTokenizer",
    "TokenSamples",
    "UnreadableShardError",
    "VAL_SPLIT",
    "assign_split",
    "build_token_dataloader",
    "c4_documents",
    "c_source_documents",
    "check_sample_length",
    "default_python_source_roots",
    "gpt2_tokenizer",
    "load_tokenizer",
    "prose_documents",
    "python_source_documents",
    "python_source_files",
    "sample_length",
    "shards_exist",
    "source_files",
    "text_directory_documents",
    "verify_shard_file",
    "wikipedia_sample_documents",
    "write_gpt2_tokenizer",
    "write_token_shards",
]
