"""Re-planning a live swarm after peers join or leave: ``moves`` (what a plan change costs),
``patch`` (broken pipelines repaired around their survivors), ``replan_candidates`` (the candidates
a re-plan weighs and their value) and ``replan`` (the warm-started re-plan the coordinator calls)."""
