"""qlift router: an OpenAI-compatible gateway that splits traffic between model versions.

The server (``qlift.router.app``) needs aiohttp and prometheus_client; the admin client
(``qlift.router.client``) needs only httpx, so promotion tooling can import it cheaply. What crosses
the admin API (state, request records, shadow settings and pairs) is typed once in ``qlift.router.wire``.
"""

from typing import TYPE_CHECKING

from qlift.lazy import lazy_exports
from qlift.router.run import RouterInputs, RouterResult, run

if TYPE_CHECKING:
    from qlift.router.config import RouterConfig
    from qlift.router.handle import RouterHandle, start

__all__ = ["RouterConfig", "RouterHandle", "RouterInputs", "RouterResult", "run", "start"]
_HOME = {"RouterConfig": "config", "RouterHandle": "handle", "start": "handle"}

# On first use, so importing the admin client does not load the server's config models.
__getattr__ = lazy_exports(__name__, _HOME)
