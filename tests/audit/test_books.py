"""The auditor's incremental lease books equal the lease formula computed the slow way
(a walk over every child and its subtree) for every ledger, after any sequence of
grants, usage, releases, renewals and the passing of time, including usage after an
end (which the audit reports but the books must still count)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from charter.audit._books import Books, Ledger
from charter.budgets.formula import charge
from charter.core.budget import Vec, vec_add

_ops = st.lists(
    st.tuples(
        st.sampled_from(["grant", "use", "release", "renew", "tick"]),
        st.integers(0, 10_000),
        st.integers(1, 50),
        st.integers(0, 40),
    ),
    max_size=60,
)


def _v(n: int) -> Vec:
    return (n, 2 * n, n, n, 0)


def _slow_used(books: Books, ledger: Ledger, t: int) -> Vec:
    def subtree(x: Ledger) -> Vec:
        total = x.spent
        for c in x.children:
            total = vec_add(total, subtree(books.ledgers[c]))
        return total

    used = ledger.spent
    for c in ledger.children:
        child = books.ledgers[c]
        used = vec_add(used, charge(child.allocation, subtree(child), child.live(t)))
    return used


@settings(max_examples=300, deadline=None)
@given(ops=_ops)
def test_incremental_books_equal_the_formula(ops: list[tuple[str, int, int, int]]) -> None:
    books = Books()
    books.open_root("r", _v(10**6))
    names = ["r"]
    t = 0
    for op, pick, amount, dt in ops:
        target = books.ledgers[names[pick % len(names)]]
        match op:
            case "grant":
                name = f"{target.lineage}/{len(names)}"
                books.grant(target, (name,), _v(amount), t + dt)
                names.append(name)
            case "use":
                books.use(target, _v(amount))
            case "release":
                books.release(target, t)
            case "renew":
                if target.parent is not None:
                    books.renew(target, t + dt, t)
            case "tick":
                t += dt
        for name in names:
            ledger = books.ledgers[name]
            used = books.used(ledger, t)
            assert used == _slow_used(books, ledger, t), (name, t)
            # the over flag the audit reads is the comparison it stands for
            over = any(u > c for u, c in zip(used, ledger.allocation, strict=True))
            assert ledger.over == over, (name, t)
