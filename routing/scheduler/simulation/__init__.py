"""How a set of pipelines serves requests, the ground truth a plan is scored by: ``stage_costs``
(per-stage prefill and decode-step times), ``interference`` (the cost of a prefill beside decoding
sequences), ``serving_sim`` (the pipelined, batched event simulation, which the coordinator also
runs live), ``simulator`` (the sequential AlpaServe-style one, and the request trace), ``serving``
(dispatch over both) and ``fitness`` (the fast analytic estimate of the same serving model)."""
