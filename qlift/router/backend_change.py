"""What the live-backend admin calls (``/admin/backends``) answer: the change made, in one line, and the
router's state after it. Needs only pydantic (and ``wire``), so the client stays cheap to import."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from qlift.router.wire import BackendState, RouterState

Change = Literal["added", "repointed", "retired", "resolved", "unchanged"]


class BackendChange(BaseModel):
    change: Change
    backend: str  # its name
    pinned: bool | None  # its model was named (URL#MODEL or the admin API); None once retired
    message: str  # one line: what changed, and why the backend is out of rotation when it is
    state: RouterState  # the router's state after the change

    def backend_state(self) -> BackendState:
        """The backend's ``BackendState`` after the change (KeyError once retired)."""
        return self.state.backend(self.backend)
