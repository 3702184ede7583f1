"""The live dashboard (GET /ui)."""
from aiohttp import web


def add_routes(app: web.Application) -> None:
    pass
