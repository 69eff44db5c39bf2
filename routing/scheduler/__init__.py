"""Placement: which peer serves which layers at which TP degree (HexGen). What the coordinator
and `hexswarm plan` call; each group below stands on the ones before it.

- The problem and its answer, here: ``gpu_catalog``, ``cluster`` (devices and links, §4.1),
  ``model_spec`` (model and workload), ``weight_formats`` (the bytes a weight takes in each
  format a device may store it in), ``cost_model`` (Table 1, Appendix B), ``plan``.
- ``pipeline_layout/``: one pipeline (§4.2, Algorithm 1): ``layer_split``, ``algorithm1``,
  ``pipeline_dp``.
- ``simulation/``: how good a plan is: ``stage_costs``, ``interference``, ``serving_sim`` (the
  pipelined, batched event simulation), ``simulator`` (the sequential one, and the request
  trace), ``serving`` (dispatch over both: a plan's ground truth), ``fitness`` (the analytic
  estimate).
- ``bounds/``: what any placement could serve: ``bound_lp``, ``upper_bound``, ``slo_bound``, and
  a plan's ``capacity`` against them.
- ``plan_eval``, here: layouts to a scored Plan and back.
- ``search/`` (§4.3): ``search_result`` (what any search returns), ``ga_operators``,
  ``ga_fitness``, ``sim_polish``, ``genetic`` (the genetic search), ``hierarchical`` (region by
  region), ``pinned_stages`` (around fixed peers), and ``search``, where every search starts.
- ``replan/``: re-planning a live swarm: ``moves`` (what a change costs), ``patch``,
  ``replan_candidates``, ``replan``.
- ``petals_rule``, here: where an auto peer goes when no coordinator is live.
"""
