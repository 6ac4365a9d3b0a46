"""The blocking Client is a thin facade of AsyncClient: every public method of one is a method
of the other, with the same parameters (names, kinds, defaults). It had drifted: create_topic
lacked wait_for_leaders, and elect_leaders, consume_batches, nodes and produce_records were
missing (issue 33)."""

from __future__ import annotations

import inspect
from typing import Any

from tidelog.client.async_client import AsyncClient
from tidelog.client.sync_client import Client

SYNC_ONLY = {
    "async_client",  # the AsyncClient under it
    "fetch_ahead",  # a fetch started on the client's thread, not awaited (Spark's read-ahead)
    "producer",  # the batching Producer's blocking face
}


def public(cls: type) -> dict[str, Any]:
    return {
        name: member
        for name, member in inspect.getmembers(cls)
        if not name.startswith("_") and (callable(member) or isinstance(member, property))
    }


def parameters(method: Any) -> list[tuple[str, Any, Any]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(method).parameters.values()]


def test_every_async_method_has_a_blocking_twin_with_the_same_parameters() -> None:
    async_methods, sync_methods = public(AsyncClient), public(Client)
    missing = sorted(set(async_methods) - set(sync_methods))
    assert missing == []
    differ = [
        name
        for name, method in async_methods.items()
        if callable(method) and parameters(method) != parameters(sync_methods[name])
    ]
    assert differ == []
    assert sorted(set(sync_methods) - set(async_methods)) == sorted(SYNC_ONLY)


def test_generators_stay_generators() -> None:
    """An async generator (consume, consume_batches) is a plain generator on the blocking side,
    and a coroutine a plain function: nothing returns an un-awaited coroutine."""
    for name, method in public(AsyncClient).items():
        if not callable(method):
            continue
        twin = getattr(Client, name)
        if inspect.isasyncgenfunction(method):
            assert inspect.isgeneratorfunction(twin), name
        else:
            assert not inspect.iscoroutinefunction(twin), name
