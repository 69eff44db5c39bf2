"""A serving process raises its open-files limit to the hard one (swarm/tools/open_files.py)."""

import resource

from hexswarm.swarm.tools.open_files import raise_open_files_limit


def test_the_soft_limit_is_raised_to_the_hard_one_and_never_lowered():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(256, hard), hard))
        now = raise_open_files_limit()
        assert now == resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        assert now == (hard if hard != resource.RLIM_INFINITY else max(256, 1 << 16))
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
