"""charter.ledger"""

__all__: list[str] = []
