"""The pure compiler: exact kernel values from the budget; nothing run, nothing discovered."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from charter.core import Budget
from charter.sandbox import HostFacts, HostFactsError, Namespace, SandboxBudgetError, compile_spec
from charter.sandbox.spec import CPU_PERIOD_US, MIN_MEMORY_BYTES

FACTS = HostFacts(sandbox_id="abc", host_uid=60001, host_gid=60001, workspace="/w", host_cpus=2)


def test_exact_values_from_the_budget() -> None:
    spec = compile_spec(Budget.parse("tokens=1k,wall=10s,cpu=5s,mem=256MiB,egress=1MB"), FACTS)
    assert spec.memory_bytes == spec.memsw_bytes == 256 * 1024**2
    assert spec.pids_max == 64  # 256 MiB / 4 MiB
    assert spec.nproc == 4 * 64 + 16  # a backstop above the cgroup cap
    assert (spec.cpu_quota_us, spec.cpu_period_us) == (50_000, 100_000)  # 5 s over 10 s
    assert spec.tmp_bytes == 64 * 1024**2
    assert spec.shm_bytes == 16 * 1024**2
    assert spec.wall_ms == 10_000
    assert spec.egress_bytes == 1_000_000
    assert set(spec.namespaces) == set(Namespace)
    assert spec.capabilities == ()
    assert spec.no_new_privs
    assert spec.die_with_parent
    assert dict(spec.env).keys() == {"PATH", "HOME", "TMPDIR", "LANG"}


def test_same_inputs_same_spec() -> None:
    b = Budget.parse("tokens=0,wall=1m,cpu=1m,mem=64MiB,egress=0MB")
    assert compile_spec(b, FACTS) == compile_spec(b, FACTS)


@pytest.mark.parametrize(
    "text",
    [
        "tokens=0,wall=0s,cpu=1s,mem=64MiB,egress=0MB",
        "tokens=0,wall=1s,cpu=0s,mem=64MiB,egress=0MB",
        "tokens=0,wall=1s,cpu=1s,mem=1MiB,egress=0MB",
    ],
)
def test_unrunnable_budgets_are_refused(text: str) -> None:
    with pytest.raises(SandboxBudgetError):
        compile_spec(Budget.parse(text), FACTS)


def test_host_facts_are_validated() -> None:
    with pytest.raises(HostFactsError):
        HostFacts(sandbox_id="a", host_uid=60001, host_gid=60001, workspace="relative")
    with pytest.raises(HostFactsError):
        HostFacts(sandbox_id="a", host_uid=60001, host_gid=60001, workspace="/w", arch="mips")
    with pytest.raises(ValueError, match="greater than or equal"):
        HostFacts(sandbox_id="a", host_uid=0, host_gid=0, workspace="/w")  # never host root


@given(
    wall=st.integers(1, 10**8),
    cpu=st.integers(1, 10**8),
    mem=st.integers(MIN_MEMORY_BYTES, 64 * 1024**3),
    cpus=st.integers(1, 64),
)
def test_caps_stay_inside_the_budget(wall: int, cpu: int, mem: int, cpus: int) -> None:
    facts = FACTS.model_copy(update={"host_cpus": cpus})
    spec = compile_spec(
        Budget(tokens=0, wall_ms=wall, cpu_ms=cpu, mem_bytes=mem, egress_bytes=0), facts
    )
    assert spec.memory_bytes <= mem
    assert spec.memory_bytes % 4096 == 0
    assert spec.tmp_bytes + spec.shm_bytes < spec.memory_bytes
    assert 16 <= spec.pids_max <= 4096
    assert 1000 <= spec.cpu_quota_us <= CPU_PERIOD_US * cpus
    # Running the whole wall clock at the quota spends the cpu budget, rounded up by less
    # than one microsecond per period (or the kernel's 1 ms minimum quota).
    if 1000 < spec.cpu_quota_us < CPU_PERIOD_US * cpus:
        assert spec.cpu_quota_us * wall / CPU_PERIOD_US - cpu < wall / CPU_PERIOD_US + 1
