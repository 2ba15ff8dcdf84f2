"""JupyterLab's identity provider in a workspace: only raypod's gateway gets in, with the IDE's token in its
``Authorization`` header, and the token is never sent to the browser.

Jupyter's own token provider writes its token into every page's configuration, which its frontend then sends
as ``Authorization: token ...``: through the gateway that would show the IDE's token to the user's browser and
clash with raypod's own credentials. Users are authenticated by the gateway; Jupyter's XSRF check is skipped as
for any token-authenticated request (the gateway refuses cross-site requests itself). Imported only by the IDE.
"""

from __future__ import annotations

import hmac
import os
from typing import Any

from jupyter_server.auth.identity import IdentityProvider, User
from traitlets import default

TOKEN_VARIABLE = "RAYPOD_SPACE_TOKEN"


class GatewayIdentityProvider(IdentityProvider):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # Taken out of the environment, so the kernels (the user's code) do not inherit it.
        self._expected = os.environ.pop(TOKEN_VARIABLE, "")

    @default("token")
    def _token_default(self) -> str:
        return ""  # what the page configuration shows

    @property
    def login_available(self) -> bool:
        return False

    def get_user(self, handler: Any) -> User | None:
        sent = handler.request.headers.get("Authorization", "")
        if not self._expected or not hmac.compare_digest(sent.encode(), f"token {self._expected}".encode()):
            return None
        handler._token_authenticated = True
        return User(username="raypod", name="raypod workspace")
