"""The read side: folds over the journal into SQL tables in the journal's database
(budgets, the lineage tree, slot occupancy), rebuildable from zero, kept current
incrementally with the tracking position in the same transaction, and queryable as of
any journal position. See docs/projections.md.
"""

from charter.projections._answers import (
    BudgetLine,
    BudgetReport,
    Burn,
    CellSlots,
    SlotsReport,
    TreeNode,
    TreeReport,
)
from charter.projections._fold import iso_to_ms
from charter.projections.errors import PositionBeyondHeadError, ProjectionConflictError
from charter.projections.projector import DEFAULT_NAME, Projector

__all__ = [
    "Projector",
    "DEFAULT_NAME",
    "BudgetLine",
    "BudgetReport",
    "Burn",
    "TreeNode",
    "TreeReport",
    "CellSlots",
    "SlotsReport",
    "iso_to_ms",
    "PositionBeyondHeadError",
    "ProjectionConflictError",
]
