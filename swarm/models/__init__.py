"""What a model is and where its weights come from: the spec every role agrees on (`model_spec`,
`model_id`, `content_hash`), the architectures served (`architectures`), loading a checkpoint
(`checkpoint`, GGUF in `gguf_checkpoint`) and the short names shipped (`builtin_models`). It
imports from `swarm.tools` only."""
