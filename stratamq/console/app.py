"""The console's Starlette application: one handler per page, each a few admin RPCs.

GET pages render templates; every change is a POST form (CSRF-checked, refused in read-only
mode) that redirects back to a page with a one-line note of what happened (Post/Redirect/Get).
Broker errors are pages too, with the broker's status code and message.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from stratamq.console import security
from stratamq.console.broker_api import DLQ_PREFIX, AdminError, ConsoleBroker
from stratamq.console.charts import Sampler, svg_chart

log = logging.getLogger(__name__)

HERE = Path(__file__).parent
HTTP_OF = {"NOT_FOUND": 404, "INVALID_ARGUMENT": 400, "ALREADY_EXISTS": 409,
           "FAILED_PRECONDITION": 409, "PERMISSION_DENIED": 403, "UNAUTHENTICATED": 403,
           "UNIMPLEMENTED": 501, "READ_ONLY": 403, "CSRF": 403}  # fmt: skip

Handler = Callable[[Request], Awaitable[Response]]


def _when(ms: int | None) -> str:
    if not ms:
        return ""
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def _size(n: int | None) -> str:
    if n is None:
        return ""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return str(n)


def body_views(body: bytes) -> dict[str, str | None]:
    """A body as text (when UTF-8), pretty JSON (when it parses) and hex."""
    try:
        text: str | None = body.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    pretty = None
    if text is not None:
        try:
            pretty = json.dumps(json.loads(text), indent=2, ensure_ascii=False)
        except ValueError:
            pretty = None
    return {"text": text, "json": pretty, "hex": body.hex(" ")}


def parse_time(text: str) -> int:
    """Epoch ms or ISO 8601 (UTC unless it says otherwise; a browser's datetime-local too)."""
    text = text.strip()
    if text.isdigit():
        return int(text)
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise AdminError("INVALID_ARGUMENT", f"not a time: {text!r} (epoch ms or ISO 8601)"
                         ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return int(when.timestamp() * 1000)


class Console:
    """The pages of one broker; ``read_only`` refuses every POST."""

    def __init__(self, broker: ConsoleBroker, *, read_only: bool = False,
                 sample_interval_s: float = 15.0) -> None:
        self.broker = broker
        self.read_only = read_only
        # Templates are package data: read once (auto_reload would stat them per page).
        env = Environment(loader=FileSystemLoader(HERE / "templates"),
                          autoescape=select_autoescape(["html"]), auto_reload=False)
        self.env = env
        env.filters["when"] = _when
        env.filters["size"] = _size
        self.sampler = Sampler(broker, interval_s=sample_interval_s)

    # -- plumbing ----------------------------------------------------------------------------

    async def rpc(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return await run_in_threadpool(fn, *args, **kwargs)

    def render(self, request: Request, template: str, http_status: int = 200, /,
               **context: Any) -> Response:
        context.update(read_only=self.read_only, csrf=security.token_of(request),
                       note=request.query_params.get("note"),
                       endpoint=self.broker.endpoint.endpoint, page=template.split(".")[0],
                       section=request.url.path.split("/")[1])
        # Rendered here rather than by Starlette's TemplateResponse, which adds per page
        # what no template uses (url_for, context processors, a debug hook).
        response = HTMLResponse(self.env.get_template(template).render(request=request,
                                                                         **context),
                                status_code=http_status)
        if getattr(request.state, "new_csrf", None):
            response.set_cookie(security.COOKIE, request.state.new_csrf, httponly=True,
                                samesite="strict")
        return response

    def page(self, fn: Handler) -> Handler:
        """``fn`` with broker errors shown as an error page."""

        async def handle(request: Request) -> Response:
            try:
                return await fn(request)
            except AdminError as exc:
                return self.render(request, "error.html", HTTP_OF.get(exc.code, 502),
                                   code=exc.code, message=exc.message)

        return handle

    def change(self, fn: Callable[[Request, dict[str, Any]], Awaitable[str]]) -> Handler:
        """A POST: CSRF and read-only checked, then ``fn(request, form)`` returns where to
        go next (a URL) and the browser is sent there."""

        async def handle(request: Request) -> Response:
            form = dict(await request.form())
            refusal = security.check_post(request, form.get(security.FIELD))
            if refusal is not None:
                raise AdminError("CSRF", refusal)
            if self.read_only:
                raise AdminError("READ_ONLY", "the console runs with --read-only: nothing "
                                 "can be changed from it")
            return RedirectResponse(await fn(request, form), status_code=303)

        return self.page(handle)

    # -- pages -------------------------------------------------------------------------------

    async def overview(self, request: Request) -> Response:
        from stratamq.broker.replication import SERVICE as HA_SERVICE

        status = await self.broker.acall("BrokerStatus")
        tier = await self.broker.aoptional("TierStatus")
        ha = await self.broker.aoptional("HaStatus", HA_SERVICE)
        # Controller mode: every broker group of the cluster from etcd (FAILED_PRECONDITION
        # otherwise, and the page shows this broker's HA view alone).
        cluster = (await self.broker.aoptional("ClusterStatus", HA_SERVICE)
                   if isinstance(ha, dict) and "cluster" in ha else None)
        return self.render(request, "overview.html", status=status, tier=tier, ha=ha,
                           groups=cluster_rows(cluster) if isinstance(cluster, dict) else None,
                           cluster_error=cluster if isinstance(cluster, str) else None)

    async def topics(self, request: Request) -> Response:
        topics = (await self.broker.acall("ListTopics"))["topics"]
        return self.render(request, "topics.html", rates=self.sampler.topic_rates(),
                           **_paged(request, topics, "topic"))

    async def topic(self, request: Request) -> Response:
        name = request.path_params["name"]
        route = await self.broker.acall("TopicRoute", topic=name)
        status = await self.broker.acall("TopicStatus", topic=name)
        topic = next((t for t in (await self.broker.acall("ListTopics"))["topics"]
                      if t["topic"] == name), None)
        return self.render(request, "topic.html", name=name, route=route, status=status,
                           topic=topic)

    async def create_topic(self, request: Request, form: dict[str, Any]) -> str:
        name = str(form.get("topic", "")).strip()
        attributes = {}
        if form.get("compaction"):
            attributes["cleanup.policy"] = "COMPACTION"
        await self.broker.acall("CreateTopic", topic=name, queues=_int(form, "queues", 8),
                                type=form.get("type", "NORMAL"), attributes=attributes)
        return _to(f"/topics/{name}", f"topic {name} created")

    async def update_topic(self, request: Request, form: dict[str, Any]) -> str:
        name = request.path_params["name"]
        attributes = {}
        if str(form.get("retention", "")).strip():
            attributes["delete.retention.ms"] = str(form["retention"]).strip()
        await self.broker.acall("UpdateTopic", topic=name,
                                read_queues=_int(form, "read_queues"),
                                write_queues=_int(form, "write_queues"),
                                force=bool(form.get("force")), attributes=attributes or None)
        return _to(f"/topics/{name}", f"topic {name} updated")

    async def delete_topic(self, request: Request, form: dict[str, Any]) -> str:
        name = request.path_params["name"]
        if form.get("confirm") != name:
            raise AdminError("INVALID_ARGUMENT",
                             f"type the topic's name ({name}) to confirm its deletion")
        await self.broker.acall("DeleteTopic", topic=name)
        return _to("/topics", f"topic {name} deleted with its messages")

    async def groups(self, request: Request) -> Response:
        groups = (await self.broker.acall("ListGroups"))["groups"]
        return self.render(request, "groups.html", **_paged(request, groups, "group"))

    async def group(self, request: Request) -> Response:
        name = request.path_params["name"]
        progress = await self.broker.acall("GroupProgress", group=name)
        topics = sorted({q["topic"] for q in progress["queues"]})
        dead = progress.get("dlq_messages")
        if dead is None:  # a broker whose GroupProgress does not count them yet
            dead = await self.broker.dead_letter_count(name)
        return self.render(request, "group.html", name=name, progress=progress, topics=topics,
                           dead=dead, retry=progress.get("retry_messages", ""))

    async def reset_group(self, request: Request, form: dict[str, Any]) -> str:
        name = request.path_params["name"]
        if not form.get("confirm"):
            raise AdminError("INVALID_ARGUMENT", "tick the confirmation to move the offsets")
        to = str(form.get("to", ""))
        if to not in ("earliest", "latest", "time"):
            raise AdminError("INVALID_ARGUMENT", "reset to earliest, latest or a time")
        when = parse_time(str(form["time"])) if to == "time" else None
        topic = str(form.get("topic", ""))
        reply = await self.broker.reset(name, topic, to, when)
        offsets = ", ".join(f"{q['queue_id']}:{q['offset']}" for q in reply["queues"])
        return _to(f"/groups/{name}", f"{name} on {topic} reset to {to}: {offsets}")

    async def messages(self, request: Request) -> Response:
        q = request.query_params
        topic, rows = q.get("topic", "").strip(), []
        # A topic alone (a link from a topic's page, the page after a send) fills the forms.
        searched = bool(topic) and any(
            q.get(f, "").strip() for f in ("key", "msg_id", "begin", "end", "queue", "offset"))
        if searched:
            if q.get("queue", "").strip() and q.get("offset", "").strip():
                got = await self.rpc(self.broker.get, topic, int(q["queue"]), int(q["offset"]))
                rows = [got] if got is not None else []
            elif q.get("key", "").strip():
                rows = await self.broker.query(topic, key=q["key"].strip())
            elif q.get("msg_id", "").strip():
                rows = await self.broker.query(topic, msg_id=q["msg_id"].strip())
            elif q.get("begin", "").strip() and q.get("end", "").strip():
                rows = await self.broker.query(topic, begin=parse_time(q["begin"]),
                                               end=parse_time(q["end"]))
            else:
                raise AdminError("INVALID_ARGUMENT",
                                 "search by key, by message id, by a time range (begin and "
                                 "end) or by queue and offset")
        for row in rows:
            row["views"] = body_views(row["body"])
        return self.render(request, "messages.html", rows=rows, searched=searched, q=q)

    async def send(self, request: Request, form: dict[str, Any]) -> str:
        topic = str(form.get("topic", "")).strip()
        keys = [k for k in str(form.get("keys", "")).split() if k]
        sent = await self.rpc(self.broker.send, topic, str(form.get("body", "")).encode(),
                              tag=str(form.get("tag", "")).strip() or None, keys=keys)
        return _to("/messages", f"sent to {topic}: message id {sent['message_id']}, queue "
                   f"offset {sent['offset']}", topic=topic)

    async def dlq(self, request: Request) -> Response:
        group = request.query_params.get("group", "").strip()
        rows = await self.broker.dead_letters(group) if group else []
        for row in rows:
            row["views"] = body_views(row["body"])
        return self.render(request, "dlq.html", group=group, rows=rows,
                           dlq_topic=DLQ_PREFIX + group)

    async def resend(self, request: Request, form: dict[str, Any]) -> str:
        group = str(form.get("group", ""))
        picked = (await request.form()).getlist("pick")
        if not picked:
            raise AdminError("INVALID_ARGUMENT", "select the dead letters to resend")
        done = []
        for item in picked:
            queue, _, offset = str(item).partition(":")
            sent = await self.rpc(self.broker.resend_dead_letter, group, int(queue),
                                  int(offset))
            done.append(sent["message_id"])
        return _to("/dlq", f"resent {len(done)} dead letters of {group}", group=group)

    async def charts(self, request: Request) -> Response:
        series = self.sampler.series()
        charts = [(title, svg_chart(points, unit)) for title, unit, points in series]
        return self.render(request, "charts.html", charts=charts,
                           interval=self.sampler.interval_s, last_error=self.sampler.last_error)

    async def favicon(self, request: Request) -> Response:
        return FileResponse(HERE / "static" / "favicon.ico", media_type="image/x-icon")

    # -- the application ---------------------------------------------------------------------

    def app(self) -> Starlette:
        @asynccontextmanager
        async def lifespan(_app: Starlette) -> Any:
            self.sampler.start()
            try:
                yield
            finally:
                self.sampler.stop()
                await self.broker.aclose()

        routes = [
            Route("/", self.page(self.overview)),
            Route("/topics", self.page(self.topics)),
            Route("/topics/create", self.change(self.create_topic), methods=["POST"]),
            Route("/topics/{name}", self.page(self.topic)),
            Route("/topics/{name}/update", self.change(self.update_topic), methods=["POST"]),
            Route("/topics/{name}/delete", self.change(self.delete_topic), methods=["POST"]),
            Route("/groups", self.page(self.groups)),
            Route("/groups/{name}", self.page(self.group)),
            Route("/groups/{name}/reset", self.change(self.reset_group), methods=["POST"]),
            Route("/messages", self.page(self.messages)),
            Route("/messages/send", self.change(self.send), methods=["POST"]),
            Route("/dlq", self.page(self.dlq)),
            Route("/dlq/resend", self.change(self.resend), methods=["POST"]),
            Route("/charts", self.page(self.charts)),
            Route("/favicon.ico", self.favicon),
            Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
        ]
        return Starlette(routes=routes, lifespan=lifespan)


def cluster_rows(cluster: dict[str, Any]) -> list[dict[str, Any]]:
    """ClusterStatus's groups, each broker with ``lag``: the CommitLog bytes it is behind its
    group's master (from the max offsets the brokers last registered; None without a
    master)."""
    groups = []
    for g in cluster.get("groups", []):
        master = next((b for b in g["brokers"] if b["brokerId"] == g["masterBrokerId"]), None)
        top = master.get("maxOffset") if master else None
        brokers = [{**b, "lag": (max(0, top - b["maxOffset"]) if top is not None
                                 and b.get("maxOffset") is not None else None),
                    "in_sync": b["brokerId"] in g["syncStateSet"]} for b in g["brokers"]]
        groups.append({**g, "brokers": brokers})
    return groups


PAGE_ROWS = 100  # rows a list page shows: a broker's thousands of topics in pages


def _paged(request: Request, rows: list[dict[str, Any]], field: str) -> dict[str, Any]:
    """One page of ``rows`` whose ``field`` contains the ``q`` filter (case-insensitive):
    ``rows``, ``total`` (matching), ``first`` (1-based), ``page_no``, ``pages``, ``q``."""
    q = request.query_params.get("q", "").strip()
    if q:
        rows = [r for r in rows if q.lower() in str(r[field]).lower()]
    pages = max(1, -(-len(rows) // PAGE_ROWS))
    try:
        page = min(max(1, int(request.query_params.get("page", "1"))), pages)
    except ValueError:
        page = 1
    start = (page - 1) * PAGE_ROWS
    return {"rows": rows[start:start + PAGE_ROWS], "total": len(rows), "first": start + 1,
            "page_no": page, "pages": pages, "q": q}


def _int(form: dict[str, Any], name: str, default: int | None = None) -> int | None:
    text = str(form.get(name, "")).strip()
    if not text:
        return default
    try:
        return int(text)
    except ValueError:
        raise AdminError("INVALID_ARGUMENT", f"{name} must be a whole number, not {text!r}"
                         ) from None


def _to(path: str, note: str, **params: str) -> str:
    return f"{path}?{urlencode({**params, 'note': note})}"

