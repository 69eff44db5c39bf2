"""The seeded 1,000-GPU cluster: deterministic, the asked size and mix, footnote-3 links."""

from collections import Counter

import numpy as np

from hexswarm.routing.scenarios.synthetic_cluster import CONSUMER, DATACENTER, synthetic_cluster


def test_same_seed_same_cluster_other_seed_other_cluster():
    a, b, c = (
        synthetic_cluster(200, 10, seed=3),
        synthetic_cluster(200, 10, seed=3),
        synthetic_cluster(200, 10, seed=4),
    )
    assert a.devices == b.devices
    assert np.array_equal(a.latency, b.latency) and np.array_equal(a.bandwidth, b.bandwidth)
    assert a.devices != c.devices


def test_size_regions_and_gpu_mix():
    cluster = synthetic_cluster()
    assert len(cluster) == 1000
    assert len({d.region for d in cluster.devices}) == 50
    types = Counter(d.type for d in cluster.devices)
    consumer = sum(types[name] for name, _ in CONSUMER)
    datacenter = sum(types[name] for name, _ in DATACENTER)
    assert consumer + datacenter == 1000
    assert 300 < consumer < 700  # about half and half


def test_machines_hold_one_to_eight_gpus_of_one_type():
    cluster = synthetic_cluster(300, 12, seed=1)
    by_machine: dict[str, list] = {}
    for device in cluster.devices:
        by_machine.setdefault(device.machine, []).append(device)
    sizes = Counter(len(devs) for devs in by_machine.values())
    assert set(sizes) <= set(range(1, 9)) and len(sizes) >= 6
    for devs in by_machine.values():
        assert len({d.type for d in devs}) == 1 and len({d.region for d in devs}) == 1


def test_links_follow_hexgen_footnote_3_and_the_network_object():
    cluster = synthetic_cluster(120, 6, seed=2)
    n = len(cluster)
    regions = np.array([d.region for d in cluster.devices])
    machines = np.array([d.machine for d in cluster.devices])
    cross = regions[:, None] != regions[None, :]
    same_region = ~cross & (machines[:, None] != machines[None, :])
    assert np.all((cluster.latency[cross] >= 0.040) & (cluster.latency[cross] <= 0.150))
    gbps = cluster.bandwidth[cross] * 8 / 1e9
    assert np.all((gbps >= 0.3 - 1e-9) & (gbps <= 1.0 + 1e-9))
    assert np.allclose(cluster.latency[same_region], 0.002)
    assert np.allclose(cluster.latency, cluster.latency.T) and np.all(np.diag(cluster.latency) == 0)
    for i, j in [(0, n - 1), (1, 2), (5, n // 2)]:  # the matrices agree with the link classes
        link = cluster.network.link(cluster.devices[i], cluster.devices[j])
        assert cluster.latency[i, j] == link.latency_s and cluster.bandwidth[i, j] == link.bandwidth
