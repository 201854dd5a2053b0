"""Talking to nameservers: address lists, rotation on failure, route and cluster queries.

RocketMQ clients stick to one nameserver and move to the next when it fails; nameservers
are independent and hold the same data (every broker registers with all of them), so any
one that answers will do. We go one step further on TOPIC_NOT_EXIST: a nameserver that has
just restarted knows no routes until brokers re-register (up to 30 s), so a "not found" is
only believed once every nameserver has said it.
"""

from __future__ import annotations

import logging
import os
import random
from collections.abc import Callable, Sequence

from client.errors import NameServerUnavailableError, NoNameServerError, RouteNotFoundError
from common.settings import ConfigError, parse_host_port
from remoting import headers as H
from remoting.client import RemotingClient
from remoting.codes import RequestCode, ResponseCode, response_code_name
from remoting.exceptions import RemotingCommandError, RemotingError
from remoting.jsonbody import Fields, load_body
from remoting.protocol import RemotingCommand
from remoting.route import ClusterInfo, TopicRouteData
from remoting.topic import topic_name_error

log = logging.getLogger("client.namesrv")

NAMESRV_ADDR_ENV = "NAMESRV_ADDR"
DEFAULT_NAMESRV_TIMEOUT_S = 3.0


def parse_namesrv_addrs(value: str | Sequence[str] | None, *, use_env: bool = True) -> list[str]:
    """``"h1:9876;h2:9876"`` or a list -> validated, de-duplicated addresses.

    None falls back to the NAMESRV_ADDR environment variable, as RocketMQ does. An empty
    result is allowed here; the first call that needs a nameserver raises NoNameServerError.
    """
    if value is None:
        value = os.environ.get(NAMESRV_ADDR_ENV, "") if use_env else ""
    parts = value.replace(",", ";").split(";") if isinstance(value, str) else list(value)
    out: list[str] = []
    for part in parts:
        addr = part.strip()
        if not addr:
            continue
        try:
            parse_host_port("nameserver address", addr)
        except ConfigError as exc:
            raise ValueError(f"bad nameserver address {addr!r}: {exc}") from None
        if addr not in out:
            out.append(addr)
    return out


class NamesrvClient:
    """Requests to whichever nameserver answers, starting with the last one that did."""

    def __init__(
        self,
        addrs: str | Sequence[str] | None,
        remoting: RemotingClient,
        *,
        timeout_s: float = DEFAULT_NAMESRV_TIMEOUT_S,
    ) -> None:
        self.addrs = parse_namesrv_addrs(addrs)
        self.remoting = remoting
        self.timeout_s = timeout_s
        # A random start spreads many clients over the nameservers.
        self._index = random.randrange(len(self.addrs)) if self.addrs else 0

    def update_addrs(self, addrs: str | Sequence[str]) -> None:
        self.addrs = parse_namesrv_addrs(addrs, use_env=False)
        self._index = 0

    def _rotation(self) -> list[str]:
        if not self.addrs:
            raise NoNameServerError(
                "no nameserver address: pass one (host:port, ';'-separated) or set NAMESRV_ADDR"
            )
        i = self._index % len(self.addrs)
        return self.addrs[i:] + self.addrs[:i]

    async def invoke(
        self,
        make_request: Callable[[], RemotingCommand],
        *,
        accept: Callable[[RemotingCommand], bool] = lambda r: r.code == ResponseCode.SUCCESS,
        what: str = "request",
    ) -> tuple[str, RemotingCommand]:
        """Ask nameservers in turn until one gives an ``accept``-able answer.

        Returns the last answer (even a refusal) if some nameserver answered; raises
        NameServerUnavailableError only when none answered at all.
        """
        errors: list[str] = []
        last: tuple[str, RemotingCommand] | None = None
        for addr in self._rotation():
            try:
                response = await self.remoting.invoke_sync(addr, make_request(), self.timeout_s)
            except RemotingError as exc:
                errors.append(f"{addr}: {exc}")
                log.warning(
                    "nameserver call failed", extra={"namesrv": addr, "what": what, "error": str(exc)}
                )
                continue
            if accept(response):
                self._index = self.addrs.index(addr)
                return addr, response
            if last is None:
                self._index = self.addrs.index(addr)
                last = (addr, response)
        if last is not None:
            return last
        raise NameServerUnavailableError(f"{what}: no nameserver answered ({'; '.join(errors)})")

    async def get_topic_route(self, topic: str) -> TopicRouteData:
        """The route of ``topic``; RouteNotFoundError if no nameserver has one."""
        problem = topic_name_error(topic)
        if problem:
            raise RouteNotFoundError(str(topic), problem)
        addr, response = await self.invoke(
            lambda: RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {H.TOPIC: topic}),
            what=f"route of topic {topic}",
        )
        if response.code == ResponseCode.TOPIC_NOT_EXIST:
            raise RouteNotFoundError(
                topic,
                f"no live broker group serves it according to nameserver(s) {', '.join(self.addrs)} "
                "(create it with 'ledgermq-admin update-topic')",
            )
        if response.code != ResponseCode.SUCCESS:
            raise NameServerUnavailableError(
                f"route of topic {topic}: {addr} answered {response_code_name(response.code)}: {response.remark}"
            )
        try:
            return TopicRouteData.from_json(load_body(response.body, "route"), "route")
        except RemotingCommandError as exc:
            raise NameServerUnavailableError(
                f"route of topic {topic} from {addr} is malformed: {exc}"
            ) from None

    async def get_cluster_info(self) -> ClusterInfo:
        addr, response = await self.invoke(
            lambda: RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_INFO), what="cluster info"
        )
        if response.code != ResponseCode.SUCCESS:
            raise NameServerUnavailableError(
                f"cluster info: {addr} answered {response_code_name(response.code)}: {response.remark}"
            )
        try:
            return ClusterInfo.from_json(load_body(response.body, "cluster info"))
        except RemotingCommandError as exc:
            raise NameServerUnavailableError(f"cluster info from {addr} is malformed: {exc}") from None

    async def get_all_topics(self) -> list[str]:
        addr, response = await self.invoke(
            lambda: RemotingCommand.request(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER), what="topic list"
        )
        if response.code != ResponseCode.SUCCESS:
            raise NameServerUnavailableError(
                f"topic list: {addr} answered {response_code_name(response.code)}: {response.remark}"
            )
        try:
            topics = Fields(load_body(response.body, "topic list"), "topic list").get_list("topicList", [])
        except RemotingCommandError as exc:
            raise NameServerUnavailableError(f"topic list from {addr} is malformed: {exc}") from None
        return [str(t) for t in topics]
