"""charter.projections"""

__all__: list[str] = []
