"""qlift router: an OpenAI-compatible gateway that splits traffic between model versions.

The server (``qlift.router.app``) needs aiohttp and prometheus_client; the admin client
(``qlift.router.client``) needs only httpx, so promotion tooling can import it cheaply.
"""
