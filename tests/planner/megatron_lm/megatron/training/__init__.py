"""`megatron.training` for the export tests: only the argument parser and its config dataclasses.

Upstream's `megatron/training/__init__.py` imports the whole trainer (global vars, checkpointing,
`pretrain`); the parser needs none of it, so this package file is autopar's and empty of imports.
See ../../README.md for the origin of the files beside it."""
