"""The OpenAI-compatible API: its command (`command`, `hexswarm api`), the server (`server`), the
request and response shapes (`schema`), admission (`admission`), generation on workers
(`generation`, text in `text`), how each answer was served (`answer_report`), the HTTP guards
(`guards`) and the chat page served at `/` (`chat_page`, `chat_page.html`). It imports from the client's own
modules, `swarm/` and `routing/`; no other client module imports it."""
