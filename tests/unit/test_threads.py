"""Default thread counts: run-peer's per model size, and the client's scoped thread count."""

from types import SimpleNamespace

import torch

from hexswarm.peer.devices import cpu_cores, default_cpu_threads
from hexswarm.swarm.tools.threads import torch_threads


def test_small_models_run_on_one_thread_and_larger_ones_on_every_core():
    tiny = SimpleNamespace(hidden_size=256, intermediate_size=688)
    medium = SimpleNamespace(hidden_size=1024, intermediate_size=2752)
    assert default_cpu_threads(tiny) == 1
    assert default_cpu_threads(medium) == cpu_cores()


def test_torch_threads_is_scoped_and_none_keeps_the_setting():
    before = torch.get_num_threads()
    with torch_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with torch_threads(None):
        assert torch.get_num_threads() == before
