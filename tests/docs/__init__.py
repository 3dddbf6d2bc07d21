"""Docs as a checked contract: what docs/ says about the code is tested against it."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
