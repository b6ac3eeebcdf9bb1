"""Time of collectives and point-to-point transfers on a hierarchical cluster (paper Sec. 5).

Ranks are numbered with the pipeline outermost: stage i owns the consecutive devices
[i·G, (i+1)·G) with G = N / pp (Takeaway #1: PP across the slowest links). Inside a stage a
group of `size` ranks with rank distance `stride` spans `size · stride` consecutive devices and
so runs over the innermost link level whose islands hold that span.

Bandwidth sharing at a level L above the innermost: `bandwidth_gb_per_s` of L is the bus
bandwidth a collective reaches when *all* devices of each inner island take part (one ring per
island crossing, nccl-tests convention). A group with only `g` of an inner island's `D` devices
runs next to D/g sibling groups that cross the same links at the same time, so each gets g/D of
it — which is why DP across nodes under TP inside nodes is slow, and why PP goes outside.

Collective times follow the ring algorithms (Thakur et al., 2005):
  all-reduce      2(n-1)/n · M / B + 2(n-1) · α
  all-gather      (n-1)/n · M / B + (n-1) · α     (M = the gathered size)
  reduce-scatter  (n-1)/n · M / B + (n-1) · α     (M = the size before scattering)
  all-to-all      (n-1)/n · M / B + (n-1) · α     (M = what one rank holds before the exchange: pairwise
                                                  exchanges, each rank sending 1/n of it to each other rank)
"""

from __future__ import annotations

from functools import lru_cache

from gbmw.specs.cluster_spec import ClusterSpec

GB = 1e9


class CommModel:
    """Collective and p2p times for one cluster; link lookups are cached by (size, stride)."""

    def __init__(self, cluster: ClusterSpec):
        self.cluster = cluster
        self.levels = cluster.links
        self._rate = lru_cache(maxsize=None)(self._rate_uncached)

    def level_index(self, span_devices: int) -> int:
        """Innermost link level whose islands hold `span_devices` consecutive devices."""
        for index, level in enumerate(self.levels):
            if span_devices <= level.devices:
                return index
        return len(self.levels) - 1

    def _rate_uncached(self, size: int, stride: int, concurrent_per_island: int | None) -> tuple[float, float]:
        """(bytes/s, latency s) of one group of `size` ranks `stride` apart."""
        index = self.level_index(size * stride)
        level = self.levels[index]
        if index == 0:
            return level.bandwidth_gb_per_s * GB, level.latency_us * 1e-6
        inner = self.levels[index - 1]
        if concurrent_per_island is None:
            # members of this group inside one inner island; the island's other devices belong to sibling groups
            members = max(1, min(size, inner.devices // stride)) if stride < inner.devices else 1
            share = members / inner.devices
        else:
            share = 1.0 / concurrent_per_island
        bandwidth = min(level.bandwidth_gb_per_s * share, inner.bandwidth_gb_per_s)
        return bandwidth * GB, level.latency_us * 1e-6

    def link_name(self, size: int, stride: int) -> str:
        return self.levels[self.level_index(size * stride)].name

    def allreduce_s(self, message_bytes: float, size: int, stride: int = 1) -> float:
        if size <= 1:
            return 0.0
        bandwidth, latency = self._rate(size, stride, None)
        return 2 * (size - 1) / size * message_bytes / bandwidth + 2 * (size - 1) * latency

    def allgather_s(self, gathered_bytes: float, size: int, stride: int = 1) -> float:
        if size <= 1:
            return 0.0
        bandwidth, latency = self._rate(size, stride, None)
        return (size - 1) / size * gathered_bytes / bandwidth + (size - 1) * latency

    reduce_scatter_s = allgather_s

    def alltoall_s(self, rank_bytes: float, size: int, stride: int = 1) -> float:
        """Every rank sends 1/size of its `rank_bytes` to each other rank of the group (the dispatch and combine
        of expert parallelism)."""
        if size <= 1:
            return 0.0
        bandwidth, latency = self._rate(size, stride, None)
        return (size - 1) / size * rank_bytes / bandwidth + (size - 1) * latency

    def p2p_in_group_s(self, message_bytes: float, size: int, stride: int = 1) -> float:
        """Every rank of a ring of `size` ranks `stride` apart sends `message_bytes` to its neighbour at once (a step
        of ring attention): at the rate of the link level the ring spans (its wrap-around crosses the widest)."""
        if size <= 1 or message_bytes <= 0:
            return 0.0
        bandwidth, latency = self._rate(size, stride, None)
        return message_bytes / bandwidth + latency

    def exchange_rate(self, group_size: int) -> tuple[float, float]:
        """(bytes/s, latency s) of the Slice-Gather exchange in a group of `group_size` consecutive devices."""
        return self._rate(group_size, 1, None)

    def exchange_s(self, received_bytes: float, group_size: int) -> float:
        """Every device of a `group_size` group receives `received_bytes` from the others at once
        (Slice-Gather between layers with different layouts)."""
        if group_size <= 1 or received_bytes <= 0:
            return 0.0
        bandwidth, latency = self._rate(group_size, 1, None)
        return received_bytes / bandwidth + latency

    def p2p_s(self, message_bytes: float, stage_devices: int) -> float:
        """One device sends `message_bytes` to its peer in the next stage, `stage_devices` ranks
        away, while all devices of its stage do the same."""
        if message_bytes <= 0:
            return 0.0
        index = self.level_index(2 * stage_devices)
        if index == 0:
            bandwidth, latency = self._rate(2, stage_devices, None)
        else:
            inner = self.levels[index - 1].devices
            bandwidth, latency = self._rate(2, stage_devices, min(stage_devices, inner))
        return message_bytes / bandwidth + latency
