"""The blocking Client is a thin facade of AsyncClient: every public method of one is a method
of the other, with the same parameters (names, kinds, defaults, types) and the same result. It
had drifted: create_topic lacked wait_for_leaders, and elect_leaders, consume_batches, nodes and
produce_records were missing (issue 33). The reads' keywords are the fields of their options
(consume.FetchOptions, ConsumeOptions), which the roles read."""

from __future__ import annotations

import dataclasses
import inspect
import re
from typing import Any

from tidelog.client.async_client import AsyncClient
from tidelog.client.consume import ConsumeOptions, FetchOptions
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


def parameters(method: Any) -> list[tuple[str, Any, Any, Any]]:
    """Name, kind, default and type of each parameter (types as written: the modules use
    `from __future__ import annotations`)."""
    return [
        (p.name, p.kind, p.default, p.annotation)
        for p in inspect.signature(method).parameters.values()
    ]


def result(method: Any) -> str:
    return str(inspect.signature(method).return_annotation)


def blocking_result(method: Any) -> str:
    """What the blocking twin of an AsyncClient method returns: the same, but an iterator
    where the async method is an async generator, and a Transaction for an AsyncTransaction."""
    blocking = re.sub(r"^AsyncGenerator\[(.*), None\]$", r"Iterator[\1]", result(method))
    return re.sub(r"^AsyncTransaction$", "Transaction", blocking)


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
    results = [
        name
        for name, method in async_methods.items()
        if callable(method) and blocking_result(method) != result(sync_methods[name])
    ]
    assert results == []
    assert sorted(set(sync_methods) - set(async_methods)) == sorted(SYNC_ONLY)


def test_the_read_keywords_are_the_fields_of_their_options() -> None:
    """fetch's keyword-only parameters are FetchOptions', consume's and consume_batches' are
    ConsumeOptions': same names, order, defaults and types, on both clients."""

    def keywords(method: Any) -> list[tuple[str, Any, Any]]:
        return [
            (p.name, p.default, p.annotation)
            for p in inspect.signature(method).parameters.values()
            if p.kind is inspect.Parameter.KEYWORD_ONLY
        ]

    def fields(options: type) -> list[tuple[str, Any, Any]]:
        return [(f.name, f.default, f.type) for f in dataclasses.fields(options)]

    for cls in (AsyncClient, Client):
        assert keywords(cls.fetch) == fields(FetchOptions), cls
        assert keywords(cls.consume) == fields(ConsumeOptions), cls
        assert keywords(cls.consume_batches) == fields(ConsumeOptions), cls


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
