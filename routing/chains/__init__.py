"""Per-request routing: which chain of peers one request passes through (Explorative Study)."""
