"""The OpenAI-compatible API: its command (`command`, `hexswarm api`), the server (`server`), the
request and response shapes (`schema`), admission (`admission`), generation on workers
(`generation`, text in `text`) and the HTTP guards (`guards`). It imports from the client's own
modules, `swarm/` and `routing/`; no other client module imports it."""
