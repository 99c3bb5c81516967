"""Run Alembic programmatically (``kip98 db migrate``, the test fixtures, the demo)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

from app.storage.urls import sqlalchemy_url

_ROOT = Path(__file__).resolve().parents[2]


def alembic_config(url: str) -> Config:
    """Config pointing at the repository's migrations, for ``url``; logging left alone."""
    cfg = Config(str(_ROOT / "alembic.ini"))
    cfg.set_main_option("script_location", str(_ROOT / "migrations"))
    cfg.set_main_option("sqlalchemy.url", sqlalchemy_url(url).replace("%", "%%"))
    cfg.attributes["configure_logging"] = False
    return cfg


def upgrade_to_head(url: str) -> None:
    command.upgrade(alembic_config(url), "head")
