"""Honest workers of one task class, drawn deterministically: what a class of real
workers looks like to the sampler (values that vary around a typical size, counters
that grow over a life), for the baseline and decide tests."""

from __future__ import annotations

import random
from collections.abc import Iterator

from charter.supervision import Observation, Signals, WorkerProfiled, observe

_MiB = 1024 * 1024


def honest_life(rng: random.Random, lineage: str, task_class: str = "review") -> list[Observation]:
    """The samples of one honest worker's life (every 250 ms), ending when it completes."""
    wall_total = rng.randint(2_000, 6_000)
    busy = rng.randint(300, 700)  # thousandths of a core it keeps busy
    final = {
        "memory_bytes": rng.randint(20 * _MiB, 40 * _MiB),
        "egress_attempts": rng.randint(0, 6),
        "spawn_calls": rng.randint(0, 2),
        "spawn_width": rng.randint(0, 3),
        "sign_calls": rng.randint(0, 3),
        "result_bytes": rng.randint(200, 4000),
        "workspace_bytes": rng.randint(0, 256 * 1024),
        "cpu_throttled_ms": rng.randint(0, 50),
    }
    samples = []
    for wall in range(250, wall_total + 1, 250):
        part = wall / wall_total
        samples.append(
            observe(
                lineage=lineage,
                sandbox_id=f"sbx-{lineage}",
                task_class=task_class,
                at_ms=1_000_000 + wall,
                wall_ms=wall,
                cpu_ms=wall * busy // 1000,
                **{k: int(v * part) for k, v in final.items()},
            )
        )
    return samples


def profile_of(samples: list[Observation]) -> Signals:
    peak = Signals()
    for sample in samples:
        peak = peak.peak(sample.signals)
    return peak


def honest_profiles(
    count: int, seed: int = 7, task_class: str = "review", outcome: str = "completed"
) -> Iterator[tuple[list[Observation], WorkerProfiled]]:
    rng = random.Random(seed)
    for i in range(count):
        lineage = f"w{seed}-{i}"
        life = honest_life(rng, lineage, task_class)
        yield (
            life,
            WorkerProfiled(
                lineage=lineage, task_class=task_class, outcome=outcome, profile=profile_of(life)
            ),
        )
