"""CSRF protection and read-only mode for the console's forms.

A form carries the token of the browser's ``stratamq_csrf`` cookie (random, HttpOnly,
SameSite=Strict) and a POST is refused unless the two match and, when the browser names one,
its Origin is the console's own: another site can neither read the cookie nor post with it.
Nothing secret travels in a URL: tokens go in form bodies, credentials stay in the process.
"""

from __future__ import annotations

import hmac
import secrets
from urllib.parse import urlsplit

from starlette.requests import Request

COOKIE = "stratamq_csrf"
FIELD = "csrf_token"


def token_of(request: Request) -> str:
    """The browser's token, or a new one (set as a cookie by ``remember``)."""
    token = request.cookies.get(COOKIE)
    if token and len(token) == 43:
        return token
    if not hasattr(request.state, "new_csrf"):
        request.state.new_csrf = secrets.token_urlsafe(32)
    return str(request.state.new_csrf)


def check_post(request: Request, form_token: object) -> str | None:
    """Why a POST is refused (None: it may go on)."""
    cookie = request.cookies.get(COOKIE)
    if not cookie or not isinstance(form_token, str) or not hmac.compare_digest(
            cookie.encode(), form_token.encode()):
        return "the form's CSRF token is missing or wrong: reload the page and try again"
    origin = request.headers.get("origin")
    if origin and origin != "null":
        host = request.headers.get("host", "")
        if urlsplit(origin).netloc != host:
            return f"a form posted from {origin} is refused (cross-site request)"
    return None
