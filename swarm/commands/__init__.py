"""The commands that run no one role: the `hexswarm` dispatcher (`cli`), the flags and parsers
every command of every role builds on (`cli_args`), `hexswarm bootstrap`, `models`, `bans`,
`make-tiny-model` and `demo` (`bootstrap`, `models_command`, `bans_command`, `tiny_model`,
`demo`). The top of `hexswarm.swarm`: it may import every other part of it; nothing below
imports it but `cli_args`, which the coordinator's commands also build on (docs/architecture.md
"Import floors")."""
