"""The console's ASGI application (Starlette): log-in, sessions, CSRF, the pages and
their JSON twins under ``/api/``, and the one action, KIP-664's abort.

A session is Starlette's signed cookie (itsdangerous), signed with the key of
``app.console.secret`` (``KIP98_CONSOLE_SECRET`` or a file under ``KIP98_HOME``), so a
restart keeps users logged in and several consoles share sessions. It holds the user's name and a CSRF token that
every POST but the log-in must carry as ``csrf_token``. Page requests without a session
are sent to ``/login``; ``/api/…`` answers 401. What a user may not see answers 403.
Failed log-ins are logged and, repeated, locked out for a while (``app.console.lockout``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hmac
import logging
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, urlsplit

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.sessions import SessionMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from app.admin import AdminClient, TopicPartition
from app.console import charts as drawn
from app.console import data
from app.console.auth import check_password, principal
from app.console.lockout import LoginThrottle
from app.console.templates import environment, timeline_svg
from app.errors import KafkaError, KafkaException
from app.security.rules import TOPIC
from app.storage.context import BrokerContext

log = logging.getLogger(__name__)

_AUTH_FAILED = {
    KafkaError.TOPIC_AUTHORIZATION_FAILED,
    KafkaError.CLUSTER_AUTHORIZATION_FAILED,
    KafkaError.GROUP_AUTHORIZATION_FAILED,
    KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
}


class _Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class _LoginNeeded(Exception):
    pass


def _int(
    request: Request, name: str, default: int | None, low: int = 0, high: int = 2**63 - 1
) -> int | None:
    raw = request.query_params.get(name, "")
    if raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise _Refused(400, f"{name} must be a whole number, not {raw[:40]!r}") from None
    if not low <= value <= high:
        raise _Refused(400, f"{name} must be between {low} and {high}")
    return value


def _time(request: Request, name: str) -> int | None:
    """A time to jump to: milliseconds since the epoch, or an ISO-8601 time (UTC unless
    it names its zone), as the pages show times."""
    raw = request.query_params.get(name, "").strip()
    if raw == "" or raw.lstrip("-").isdigit():
        return _int(request, name, None)
    try:
        moment = datetime.fromisoformat(raw.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise _Refused(
            400,
            f"{name} must be milliseconds since the epoch or an ISO-8601 time, not {raw[:40]!r}",
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return max(int(moment.timestamp() * 1000), 0)


def _form_int(form: Any, name: str) -> int:
    raw = str(form.get(name, ""))
    try:
        value = int(raw)
    except ValueError:
        raise _Refused(400, f"{name} must be a whole number, not {raw[:40]!r}") from None
    if not 0 <= value < 2**63:
        raise _Refused(400, f"{name} is out of range")
    return value


def create_app(
    url: str | None = None,
    read_only: bool = False,
    https_only: bool = False,
    session_key: str | None = None,
    throttle: LoginThrottle | None = None,
) -> Starlette:
    """The console over the database at ``url`` (kip98's configured one when None),
    its cookies signed with ``session_key`` (a key of this process alone when None)."""
    base = BrokerContext.connect(url)
    throttle = throttle or LoginThrottle()
    # Log-ins one at a time: a burst of concurrent guesses would all pass the lockout's
    # check before the first of them failed (a check is a few ms of key derivation).
    one_login = asyncio.Lock()
    db_url = url or base.engine.url.render_as_string(hide_password=False)
    templates = environment()

    def broker_of(request: Request) -> BrokerContext:
        user = request.session.get("user")
        if not user:
            raise _LoginNeeded()
        return dataclasses.replace(base, principal=principal(user))

    def is_api(request: Request) -> bool:
        return request.url.path == "/api" or request.url.path.startswith("/api/")

    def render(request: Request, template: str, status: int = 200, **values: Any) -> HTMLResponse:
        page = templates.get_template(template).render(
            user=request.session.get("user"), csrf_token=request.session.get("csrf", ""),
            read_only=read_only, **values,
        )  # fmt: skip
        return HTMLResponse(page, status_code=status)

    def error(request: Request, status: int, message: str) -> Response:
        if is_api(request):
            return JSONResponse({"error": message}, status_code=status)
        return render(request, "error.html", status=status, code=status, message=message)

    def page(
        template: str,
        read: Callable[[Request, BrokerContext], Any],
        extra: Callable[..., dict[str, Any]] | None = None,
    ) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            broker = broker_of(request)
            d = await run_in_threadpool(read, request, broker)
            if is_api(request):
                return JSONResponse(d)
            more = await run_in_threadpool(extra, request, broker, d) if extra else {}
            return render(request, template, d=d, **more)

        return endpoint

    def read_topic(request: Request, broker: BrokerContext) -> dict[str, Any]:
        isolation = request.query_params.get("isolation", "read_committed")
        if isolation not in data.ISOLATIONS:
            raise _Refused(400, f"isolation must be one of {', '.join(data.ISOLATIONS)}")
        return data.topic(
            broker,
            request.path_params["name"],
            partition=_int(request, "partition", 0, high=2**31 - 1) or 0,
            offset=_int(request, "offset", None),
            limit=_int(request, "limit", data.DEFAULT_LIMIT, low=1, high=data.MAX_LIMIT) or 1,
            isolation=isolation,
            timestamp=_time(request, "timestamp"),
        )

    def overview_extra(
        request: Request, broker: BrokerContext, d: dict[str, Any]
    ) -> dict[str, Any]:
        return drawn.overview_page(d)

    def transactions_extra(
        request: Request, broker: BrokerContext, d: dict[str, Any]
    ) -> dict[str, Any]:
        topics = sorted({h["topic"] for h in d["hanging"]})
        with broker.engine.connect() as conn:
            allowed = [t for t in topics if data.may_abort(conn, broker, t)]
        return {"actions": not read_only, "may_abort": allowed,
                "message": request.query_params.get("message", "")[:200]}  # fmt: skip

    async def login_form(request: Request) -> Response:
        return render(request, "login.html", next=_safe_next(request.query_params.get("next")))

    async def login(request: Request) -> Response:
        form = await request.form()
        name, password = str(form.get("username", "")), str(form.get("password", ""))
        target = _safe_next(str(form.get("next", "")))
        async with one_login:
            return await _log_in(request, name, password, target)

    async def _log_in(request: Request, name: str, password: str, target: str) -> Response:
        host = request.client.host if request.client else "unknown"
        address = f"{host}:{request.client.port}" if request.client else host
        wait = throttle.locked_for(host, name)
        if wait > 0:
            _log_lines(throttle.failed(host, address, name, locked=True))
            seconds = int(wait) + 1
            page = render(
                request, "login.html", status=429, next=target,
                error=f"Too many failed log-ins: try again in {seconds} s.",
            )  # fmt: skip
            page.headers["Retry-After"] = str(seconds)
            return page
        if not await run_in_threadpool(check_password, base, name, password):
            _log_lines(throttle.failed(host, address, name))
            return render(
                request, "login.html", status=401, next=target, error="Wrong user or password."
            )
        throttle.succeeded(host, name)
        request.session.clear()
        request.session.update({"user": name, "csrf": secrets.token_urlsafe(32)})
        return RedirectResponse(target, status_code=303)

    async def checked_form(request: Request) -> Any:
        """The POST's form, once its CSRF token is the session's."""
        broker_of(request)
        form = await request.form()
        sent, expected = str(form.get("csrf_token", "")), str(request.session.get("csrf", ""))
        if not expected or not hmac.compare_digest(sent.encode(), expected.encode()):
            raise _Refused(403, "the form's CSRF token is missing or wrong; reload the page")
        return form

    async def logout(request: Request) -> Response:
        await checked_form(request)
        request.session.clear()
        return RedirectResponse("/login", status_code=303)

    async def topic_action(request: Request) -> tuple[Any, BrokerContext, str, int]:
        """An action's form on a partition, refused unless it carries the CSRF token, the
        console may act and the user may see the topic: the form, the broker as the user,
        the topic and the partition."""
        form = await checked_form(request)
        if read_only:
            raise _Refused(403, "the console is read-only")
        broker = broker_of(request)
        topic = str(form.get("topic", ""))
        with broker.engine.connect() as conn:
            if not data.visible(conn, broker, TOPIC, [topic]):
                raise _Refused(403, f"not authorized to Describe topic {topic!r}")
        return form, broker, topic, _form_int(form, "partition")

    async def abort(request: Request) -> Response:
        form, broker, topic, partition = await topic_action(request)
        start = _form_int(form, "start_offset")

        def run() -> bool:
            with AdminClient({"database.url": db_url, "principal": broker.principal}) as admin:
                return admin.abort_transaction(topic, partition, start)

        written = await run_in_threadpool(run)
        what = f"the transaction at offset {start} of {topic}-{partition}"
        message = f"Aborted {what}." if written else f"{what.capitalize()} was already closed."
        return RedirectResponse(f"/transactions?message={quote(message)}", status_code=303)

    async def delete_records(request: Request) -> Response:
        """Kafka's DeleteRecords for one partition: its log start moves to the offset."""
        form, broker, topic, partition = await topic_action(request)
        before = _form_int(form, "before_offset")
        with broker.engine.connect() as conn:
            if not data.may_delete_records(conn, broker, topic):
                raise _Refused(403, f"not authorized to Delete records of topic {topic!r}")

        def run() -> int:
            with AdminClient({"database.url": db_url, "principal": broker.principal}) as admin:
                done = admin.delete_records([TopicPartition(topic, partition, before)])
                return next(iter(done.values())).result().low_watermark

        low = await run_in_threadpool(run)
        message = f"The log of {topic}-{partition} starts at offset {low}."
        return RedirectResponse(
            f"/topics/{quote(topic)}?partition={partition}&message={quote(message)}",
            status_code=303,
        )

    def topic_extra(request: Request, broker: BrokerContext, d: dict[str, Any]) -> dict[str, Any]:
        with broker.engine.connect() as conn:
            may = not read_only and data.may_delete_records(conn, broker, d["topic"])
        return {"may_delete": may, "message": request.query_params.get("message", "")[:200]}

    async def on_refused(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, _Refused)
        return error(request, exc.status, exc.message)

    async def on_login_needed(request: Request, exc: Exception) -> Response:
        if is_api(request) or request.method != "GET":
            return JSONResponse({"error": "log in first"}, status_code=401)
        return RedirectResponse(f"/login?next={quote(request.url.path)}", status_code=303)

    async def on_not_found(request: Request, exc: Exception) -> Response:
        return error(request, 404, str(exc))

    async def on_forbidden(request: Request, exc: Exception) -> Response:
        return error(request, 403, str(exc))

    async def on_kafka(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, KafkaException)
        code = exc.error.code()
        status = 403 if code in _AUTH_FAILED else 400
        return error(request, status, exc.error.str())

    async def on_http(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        return error(request, exc.status_code, str(exc.detail))

    async def on_crash(request: Request, exc: Exception) -> Response:
        return error(request, 500, "the console failed to answer; see its log")

    pages: list[tuple[str, str, Callable[[Request, BrokerContext], Any], Any]] = [
        ("/", "overview.html", lambda r, b: data.overview(b), overview_extra),
        ("/topics", "topics.html", lambda r, b: data.topics(b), None),
        ("/topics/{name:path}", "topic.html", read_topic, topic_extra),
        ("/transactions", "transactions.html", lambda r, b: data.transactions(b), transactions_extra),
        ("/transactions/{id:path}", "transaction.html",
         lambda r, b: data.transaction(b, r.path_params["id"]),
         lambda r, b, d: {"timeline": timeline_svg(d["events"], d["markers"])}),
        ("/producers", "producers.html", lambda r, b: data.producers(b), None),
        ("/groups", "groups.html", lambda r, b: data.groups(b), None),
        ("/groups/{id:path}", "group.html", lambda r, b: data.group(b, r.path_params["id"]), None),
    ]  # fmt: skip
    routes = [
        Route("/login", login_form, methods=["GET"]),
        Route("/login", login, methods=["POST"]),
        Route("/logout", logout, methods=["POST"]),
        Route("/transactions/abort", abort, methods=["POST"]),
        Route("/topics/delete-records", delete_records, methods=["POST"]),
    ]
    for path, template, read, extra in pages:
        endpoint = page(template, read, extra)
        routes.append(Route(path, endpoint, methods=["GET"]))
        routes.append(Route("/api" + ("" if path == "/" else path), endpoint, methods=["GET"]))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            _log_lines(throttle.flush())

    return Starlette(
        lifespan=lifespan,
        routes=routes,
        middleware=[
            Middleware(
                SessionMiddleware,
                secret_key=session_key or secrets.token_hex(32),
                session_cookie="kip98_console",
                same_site="strict",
                https_only=https_only,
                max_age=12 * 3600,
            )
        ],
        exception_handlers={
            _Refused: on_refused,
            _LoginNeeded: on_login_needed,
            data.NotFound: on_not_found,
            data.Forbidden: on_forbidden,
            KafkaException: on_kafka,
            HTTPException: on_http,
            Exception: on_crash,
        },
    )


def _log_lines(lines: list[str]) -> None:
    for line in lines:
        log.warning("kip98 console: %s", line)


def _safe_next(target: str | None) -> str:
    """Where to go after logging in: a path on this console only (no open redirect)."""
    if not target or not target.startswith("/") or target.startswith("//"):
        return "/"
    parts = urlsplit(target)
    return "/" if parts.scheme or parts.netloc or "\\" in target else target


__all__ = ["create_app"]
